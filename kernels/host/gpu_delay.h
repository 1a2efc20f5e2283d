// kernels/host/: host-side glue; the device primitives are in kernels/common/.
// attnlab: a queued wait on the GPU, for the harness's timers.
#pragma once

#include <cuda_runtime.h>

namespace attnlab {

// Enqueues on `stream` one single-thread kernel that spins for about
// `microseconds` (by the SM's global timer). A timer enqueues it before its
// start event, so that the launch it times — its host-side dispatch included
// (cuDNN's, through torch, is tens of microseconds) — is queued while the GPU
// is still busy, and the events measure GPU time only.
cudaError_t enqueue_gpu_delay(cudaStream_t stream, unsigned microseconds);

}  // namespace attnlab
