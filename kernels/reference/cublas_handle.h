// attnlab: the one cuBLAS handle of the process, for the references and the
// unfused baseline (each call sets its stream first).
#pragma once

#include <cublas_v2.h>

namespace attnlab {

// nullptr when cuBLAS could not be initialised (no GPU).
inline cublasHandle_t reference_cublas_handle() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) h = nullptr;
    return h;
  }();
  return handle;
}

}  // namespace attnlab
