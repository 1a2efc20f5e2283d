// attnlab: the block-sparse backward at D = 192, Dv = 128 (bwd_kernel.cuh), both modes.
#include "blocksparse/bwd_kernel.cuh"

namespace attnlab {
template cudaError_t blocksparse_bwd_dims<192, 128, false>(const AttnProblem&, const AttnGradBuffers&,
                                                          const BlockSparseBwdLists&, const MaskMod&, const ScoreMod&,
                                                          cudaStream_t);
template cudaError_t blocksparse_bwd_dims<192, 128, true>(const AttnProblem&, const AttnGradBuffers&,
                                                          const BlockSparseBwdLists&, const MaskMod&, const ScoreMod&,
                                                          cudaStream_t);
}  // namespace attnlab
