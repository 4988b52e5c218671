// One backward case on the GPU: the forward case's random inputs and layout,
// a random dout laid out like out, the forward (for out and its log-sum-exp)
// and the backward into poisoned dq, dk, dv, checked against the float64
// reference gradients with the tolerance rule.
#pragma once

#include <vector>

#include "flash3/flash3.hpp"
#include "forward_case.hpp"
#include "reference/attention_ref.hpp"

namespace flash3::test {

struct BackwardCase {
  ForwardCase forward;
  bool deterministic = false;

  std::string name() const;
};

// What the device holds after a backward call.
struct Gradients {
  std::vector<float> dq, dk, dv;  // contiguous (batch, seqlen, heads, headdim)
  size_t unwritten = 0;           // elements of dq, dk, dv still holding the poison
  size_t clobbered = 0;           // elements of their buffer outside the views that changed
};

// The case's problem on the device with its forward done: run() enqueues the
// backward on `stream` and download() copies the gradients back.
class BackwardProblem {
 public:
  BackwardProblem(const BackwardCase& c, const Inputs& inputs, const std::vector<float>& dout);

  Status run(cudaStream_t stream) const;
  Gradients download() const;
  const DeviceProblem& forward() const { return forward_; }
  Output forward_output() const { return forward_.download(); }

 private:
  BackwardOptions options() const;

  BackwardCase case_;
  Placement place_;  // dq, dk, dv at q, k, v's places; dout at out's
  DeviceProblem forward_;
  DeviceBuffer dout_, grads_;
  // The caller's workspace, poisoned once (NaN floats, -1 ints): the
  // backward may assume nothing of its contents, and later runs find the
  // sums of the earlier ones there.
  size_t workspace_bytes_ = 0;
  DeviceBuffer workspace_;
};

// N(0, 1) dout (out's shape) of the case's dtype, seeded by the case's name.
std::vector<float> random_dout(const BackwardCase& c);

// Runs the case and checks dq, dk, dv against the reference; skips when its
// kernel is not in this build.
void expect_gradients_match_reference(const BackwardCase& c);

}  // namespace flash3::test
