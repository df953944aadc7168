#include "flash3/host/device.h"

#include <cuda_runtime_api.h>

#include <array>
#include <mutex>

namespace flash3::host {

const DeviceInfo& device_info(int device) {
  constexpr int kMaxDevices = 64;
  static std::array<DeviceInfo, kMaxDevices> infos;
  static std::array<std::once_flag, kMaxDevices> flags;
  check(device >= 0 && device < kMaxDevices, "flash3: device index ", device, " out of range");
  std::call_once(flags[device], [device] {
    DeviceInfo& d = infos[device];
    auto get = [device](cudaDeviceAttr attr) {
      int v = 0;
      const cudaError_t err = cudaDeviceGetAttribute(&v, attr, device);
      check(err == cudaSuccess, "flash3: cudaDeviceGetAttribute failed: ", cudaGetErrorString(err));
      return v;
    };
    d.major = get(cudaDevAttrComputeCapabilityMajor);
    d.minor = get(cudaDevAttrComputeCapabilityMinor);
    d.num_sms = get(cudaDevAttrMultiProcessorCount);
    d.l2_bytes = get(cudaDevAttrL2CacheSize);
  });
  return infos[device];
}

const char* last_launch_error() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

const char* cuda_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

}  // namespace flash3::host
