// attnlab: the masked modes of the ladder-only harness (CMake target `ladder`,
// build/flash_attn_ladder). That harness is flash_attn_mma linked with the
// rungs of kernels/flash_attn/ and the references only, without the
// block-sparse, dynamic-mask, variable-length and paged-decoding kernels:
// their four modes stop with one line and exit 2, naming the build that has
// them (--mask-mod, --varlen and --decode before the GPU is looked for, as
// flash_attn_mma's own option errors are). Every other option runs as in
// flash_attn_mma.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "blocksparse_mode.h"
#include "decode_mode.h"
#include "dmattn_mode.h"
#include "varlen_mode.h"

namespace attnlab {

namespace {

std::string not_in_this_build(const char* options) {
  return std::string(options) +
         " needs the full harness (cmake --build build, then build/flash_attn_mma); this one has the ladder's "
         "rungs only";
}

[[noreturn]] void stop(const char* options) {
  std::fprintf(stderr, "flash_attn_ladder: error: %s\n", not_in_this_build(options).c_str());
  std::exit(kExitBadOptions);
}

}  // namespace

std::string blocksparse_options_unsupported(const CommonOptions&, const BlocksparseOptions&) {
  return not_in_this_build("--mask-mod");
}

std::vector<ListEntry> blocksparse_list(const CommonOptions&) { stop("--mask-mod"); }

int run_blocksparse_mode(const CommonOptions&, const BlocksparseOptions&, const SystemInfo&, uint64_t, cudaStream_t) {
  stop("--mask-mod");
}

int run_dynamic_mask_mode(const CommonOptions&, const DynamicMaskOptions&, const SystemInfo&, uint64_t, cudaStream_t) {
  stop("--mask");
}

std::string varlen_options_unsupported(const VarlenOptions&) { return not_in_this_build("--varlen"); }

std::vector<ListEntry> varlen_list() { stop("--varlen"); }

int run_varlen_mode(const CommonOptions&, const VarlenOptions&, const SystemInfo&, uint64_t, cudaStream_t) {
  stop("--varlen");
}

std::string decode_options_unsupported(const DecodeOptions&) { return not_in_this_build("--decode"); }

std::vector<ListEntry> decode_list() { stop("--decode"); }

int run_decode_mode(const CommonOptions&, const DecodeOptions&, const SystemInfo&, uint64_t, cudaStream_t) {
  stop("--decode");
}

}  // namespace attnlab
