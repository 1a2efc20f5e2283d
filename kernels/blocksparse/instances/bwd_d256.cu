// attnlab: the block-sparse backward at D = 256 (bwd_kernel.cuh).
#include "blocksparse/bwd_kernel.cuh"

namespace attnlab {
template cudaError_t blocksparse_bwd_dims<256, 256>(const AttnProblem&, const AttnGradBuffers&,
                                                     const BlockSparseBwdLists&, const MaskMod&, const ScoreMod&, bool,
                                                     cudaStream_t);
}  // namespace attnlab
