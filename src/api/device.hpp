// Checks that need the CUDA runtime: a Hopper device is current, and every
// pointer of the call is device memory on it.
#pragma once

#include "flash3/flash3.hpp"
#include "params.hpp"

namespace flash3::detail {

// Fills params->device and params->num_sms, or says why this device cannot run flash3.
Status check_device(ForwardParams* params);

// Every pointer in params must be device (or managed) memory of params->device.
Status check_pointers(const ForwardParams& params);

}  // namespace flash3::detail
