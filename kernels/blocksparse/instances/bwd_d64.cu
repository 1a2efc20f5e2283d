// attnlab: the block-sparse backward at D = 64 (bwd_kernel.cuh).
#include "blocksparse/bwd_kernel.cuh"

namespace attnlab {
template cudaError_t blocksparse_bwd_dims<64, 64>(const AttnProblem&, const AttnGradBuffers&,
                                                     const BlockSparseBwdLists&, const MaskMod&, const ScoreMod&, bool,
                                                     cudaStream_t);
}  // namespace attnlab
