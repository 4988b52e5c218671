// Checks that need the CUDA runtime: a Hopper device is current, and every
// pointer of the call is device memory on it.
#pragma once

#include "flash3/flash3.hpp"
#include "sm90/problem.hpp"

namespace flash3::detail {

// Fills params->device and num_sms, or says why this device cannot run
// flash3; `call` names the public call in messages.
Status check_device(const char* call, DeviceFields* params);

// Every pointer in params must be device (or managed) memory of params->device.
Status check_pointers(const char* call, const ForwardParams& params);
Status check_pointers(const char* call, const BackwardParams& params);
Status check_pointers(const char* call, const QuantizeParams& params);
Status check_pointers(const char* call, const Fp8VLayoutParams& params);
Status check_pointers(const char* call, const CombineParams& params);
Status check_pointers(const char* call, const KvAppendParams& params);

}  // namespace flash3::detail
