// The CUDA runtime as the host layer sees it: device attributes and launch errors. device.cpp is the
// only file of csrc/flash3/host/ that includes a CUDA header (tests/cpp/host_layer_driver.cpp links
// a stand-in instead).
#pragma once
#include "flash3/host/check.h"

namespace flash3::host {

struct DeviceInfo {
  int major = 0, minor = 0, num_sms = 0, l2_bytes = 0;
};

// Attributes of a device, queried once per device (cudaDeviceGetAttribute).
const DeviceInfo& device_info(int device);

// cudaGetLastError() after a launch: nullptr when it is cudaSuccess, else its message.
const char* last_launch_error();

// cudaGetErrorString of an error code a launcher returned (run_combine, run_append_kv, ...).
const char* cuda_error_string(int err);

inline void check_hopper(const DeviceInfo& dev, const TensorView& q, const char* op) {
  check(dev.major == 9 && dev.minor == 0, op, " needs an sm_90 (Hopper) GPU; ", q.device, " is sm_", dev.major,
        dev.minor);
}

}  // namespace flash3::host
