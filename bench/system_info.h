// attnlab: what a results row records about where it was measured.
#pragma once

#include <string>

namespace attnlab {

struct SystemInfo {
  std::string gpu = "none";       // device name, e.g. "NVIDIA H200"
  std::string driver = "unknown"; // NVIDIA driver version, e.g. "580.159.04"
  std::string cuda = "unknown";   // "runtime 13.0, driver API 13.0"
  std::string commit = "unknown"; // attnlab commit (+"-dirty" with local changes)
  std::string date;               // UTC, ISO 8601
};

// Reads the current device's facts; safe to call without a GPU.
SystemInfo collect_system_info();

// "NVIDIA H200" -> "H200": the folder name under results/.
std::string gpu_slug(const std::string& gpu_name);

}  // namespace attnlab
