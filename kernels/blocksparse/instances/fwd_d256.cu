// attnlab: the block-sparse forward at D = 256 (fwd_kernel.cuh).
#include "blocksparse/fwd_kernel.cuh"

namespace attnlab {
template cudaError_t blocksparse_fwd_dims<256, 256>(const AttnProblem&, const AttnBuffers&, const BlockMaskView&,
                                                     const MaskMod&, const ScoreMod&, cudaStream_t);
}  // namespace attnlab
