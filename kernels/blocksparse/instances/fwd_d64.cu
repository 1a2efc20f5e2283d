// attnlab: the block-sparse forward at D = 64 (fwd_kernel.cuh).
#include "blocksparse/fwd_kernel.cuh"

namespace attnlab {
template cudaError_t blocksparse_fwd_dims<64, 64>(const AttnProblem&, const AttnBuffers&, const BlockMaskView&,
                                                     const MaskMod&, const ScoreMod&, cudaStream_t);
}  // namespace attnlab
