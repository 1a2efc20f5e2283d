// attnlab: the block-sparse backward at D = 128 (bwd_kernel.cuh).
#include "blocksparse/bwd_kernel.cuh"

namespace attnlab {
template cudaError_t blocksparse_bwd_dims<128, 128>(const AttnProblem&, const AttnGradBuffers&,
                                                     const BlockSparseBwdLists&, const MaskMod&, const ScoreMod&, bool,
                                                     cudaStream_t);
}  // namespace attnlab
