#include "system_info.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#ifndef ATTNLAB_SOURCE_DIR
#define ATTNLAB_SOURCE_DIR "."
#endif
#ifndef ATTNLAB_CONFIGURE_COMMIT
#define ATTNLAB_CONFIGURE_COMMIT "unknown"
#endif

namespace attnlab {
namespace {

std::string run_command(const std::string& cmd) {
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
  }
  while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) out.pop_back();
  return out;
}

// The driver version through NVML, loaded at run time so that the binary still
// starts (and reports "no GPU") on machines without a driver.
std::string nvml_driver_version() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_LAZY);
  if (!lib) return "";
  using InitFn = int (*)();
  using VersionFn = int (*)(char*, unsigned);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
  auto version = reinterpret_cast<VersionFn>(dlsym(lib, "nvmlSystemGetDriverVersion"));
  auto shutdown = reinterpret_cast<InitFn>(dlsym(lib, "nvmlShutdown"));
  std::string result;
  if (init && version && init() == 0) {
    char buf[96] = {};
    if (version(buf, sizeof buf) == 0) result = buf;
    if (shutdown) shutdown();
  }
  dlclose(lib);
  return result;
}

std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

}  // namespace

SystemInfo collect_system_info() {
  SystemInfo s;
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess)
    s.gpu = prop.name;
  int runtime = 0, driver_api = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver_api);
  s.cuda = "runtime " + version_string(runtime) + ", driver API " + version_string(driver_api);
  const std::string nvml = nvml_driver_version();
  if (!nvml.empty()) s.driver = nvml;

  if (const char* env = std::getenv("ATTNLAB_COMMIT"); env && *env) {
    s.commit = env;
  } else {
    const std::string git = "git -C '" + std::string(ATTNLAB_SOURCE_DIR) + "' ";
    s.commit = run_command(git + "rev-parse --short=12 HEAD 2>/dev/null");
    if (s.commit.empty()) s.commit = ATTNLAB_CONFIGURE_COMMIT;
    else if (!run_command(git + "status --porcelain --untracked-files=no 2>/dev/null").empty()) s.commit += "-dirty";
  }
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  s.date = date;
  return s;
}

std::string gpu_slug(const std::string& gpu_name) {
  std::string name = gpu_name;
  for (const char* prefix : {"NVIDIA ", "GeForce "})
    if (name.rfind(prefix, 0) == 0) name = name.substr(std::string(prefix).size());
  std::string slug;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '.') slug += c;
    else if (!slug.empty() && slug.back() != '-') slug += '-';
  }
  while (!slug.empty() && slug.back() == '-') slug.pop_back();
  return slug.empty() ? "unknown-gpu" : slug;
}

}  // namespace attnlab
