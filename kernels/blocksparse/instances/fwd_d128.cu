// attnlab: the block-sparse forward at D = 128 (fwd_kernel.cuh).
#include "blocksparse/fwd_kernel.cuh"

namespace attnlab {
template cudaError_t blocksparse_fwd_dims<128, 128>(const AttnProblem&, const AttnBuffers&, const BlockMaskView&,
                                                     const MaskMod&, const ScoreMod&, cudaStream_t);
}  // namespace attnlab
