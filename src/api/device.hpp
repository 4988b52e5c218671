// Checks that need the CUDA runtime: a Hopper device is current, and every
// pointer of the call is device memory on it.
#pragma once

#include "flash3/flash3.hpp"
#include "params.hpp"

namespace flash3::detail {

// Fills params->device (and the forward's num_sms), or says why this device
// cannot run flash3.
Status check_device(ForwardParams* params);
Status check_device(QuantizeParams* params);
Status check_device(Fp8VLayoutParams* params);

// Every pointer in params must be device (or managed) memory of params->device.
Status check_pointers(const ForwardParams& params);
Status check_pointers(const QuantizeParams& params);
Status check_pointers(const Fp8VLayoutParams& params);

}  // namespace flash3::detail
