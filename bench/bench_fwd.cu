// flash3_bench: forward throughput of flash3 over the grid of shared/TARGETS.md.
//
// Every cell has batch x seqlen = 16384 tokens (one batch from seqlen 16384 up; --batch sets it) and
// hidden 2048, so heads = 2048 / headdim. Inputs are random normal, made on the GPU.
// Each figure is the median of --iters CUDA-event timings of one flash3::forward call
// (writing the log-sum-exp too, as the Python API does) after --warmup calls.
// FLOPs = 4 * batch * heads * seqlen^2 * headdim, halved when causal (with
// --window, 4 * batch * heads * the visible scores * headdim; with
// --headdim-v dv, 2 * (headdim + dv) in place of 4 * headdim).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "flash3/flash3.hpp"

namespace {

constexpr int64_t kTokens = 16384;  // batch * seqlen of every cell
constexpr int64_t kHidden = 2048;   // heads * headdim of every cell (at most: 10 x 192)

// --fp8-scales block: one scale per this many rows of each (batch, head).
constexpr int kFp8BlockRows = 128;

enum ExitCode { kExitOk = 0, kExitCallFailed = 1, kExitUsage = 2, kExitNoHopper = 3 };

const char kUsage[] =
    "usage: flash3_bench [options]\n"
    "  --dtype bf16|fp16|fp8|all     (default all: bf16 and fp16; fp8 times the FP8 forward\n"
    "                                alone on e4m3 inputs, bf16 out, and separately the\n"
    "                                quantization of bf16 q, k, v: Hadamard on q, k; its\n"
    "                                memory traffic in GB/s beside a device copy's)\n"
    "  --fp8-scales block|head       fp8 descales: one per 128 rows of each (batch, head)\n"
    "                                (default, flash3's block quantization) or one per\n"
    "                                (batch, head) (FlashAttention-3's descales)\n"
    "  --headdim LIST|all            comma-separated, from 64,96,128,192,256 (default and all: 64,128,256;\n"
    "                                2048 / headdim heads, rounded down: 10 at 192)\n"
    "  --causal 0|1|all              (default all)\n"
    "  --seqlen LIST|all             comma-separated (default 512,1024,2048,4096,8192,16384)\n"
    "  --batch N                     batch of every cell (default 16384 / seqlen, at least 1:\n"
    "                                the grid's 16384 tokens)\n"
    "  --warmup N                    untimed calls per cell (default 5)\n"
    "  --iters N                     timed calls per cell, median reported (default 20)\n"
    "  --backward                    time flash3::backward (16-bit dtypes; FLOPs 2.5x the\n"
    "                                forward's; the workspace allocated once, outside the timing)\n"
    "  --deterministic               with --backward: deterministic mode\n"
    "  --headdim-v N                 v's and out's head dim (16-bit; default: the head dim):\n"
    "                                128 with --headdim 192 is DeepSeek's (192, 128)\n"
    "  --window LEFT                 a sliding window of LEFT keys left of the diagonal\n"
    "                                (window_size (LEFT, -1); with --causal 1, Mistral's);\n"
    "                                FLOPs counted on the visible scores\n"
    "  --softcap C                   logit softcapping at C (16-bit dtypes)\n"
    "  --sinks                       attention sinks (zeros) for every head (16-bit dtypes;\n"
    "                                the backward without their gradient)\n"
    "  --json PATH                   also write the results as JSON\n"
    "  --commit SHA                  recorded in the JSON metadata\n"
    "exit codes: 0 every cell ran; 1 a flash3 or CUDA call failed (its row says why, the\n"
    "other cells still run); 2 bad command line; 3 no Hopper (sm_90) GPU (as scripts/)\n";

struct Options {
  std::vector<flash3::DType> dtypes{flash3::DType::kBFloat16, flash3::DType::kFloat16};
  std::vector<int> headdims{64, 128, 256};
  std::vector<int> causals{0, 1};
  std::vector<int> seqlens{512, 1024, 2048, 4096, 8192, 16384};
  int warmup = 5;
  int iters = 20;
  int batch = 0;                 // --batch; 0: the grid's 16384 / seqlen
  bool fp8_head_scales = false;  // --fp8-scales head
  bool backward = false;         // --backward
  bool deterministic = false;    // --deterministic
  int headdim_v = 0;             // --headdim-v; 0: the head dim
  int window_left = -1;          // --window; -1: none
  float softcap = 0.0f;          // --softcap; 0: none
  bool sinks = false;            // --sinks
  std::string json_path;
  std::string commit;
};

// Scores a (seqlen x seqlen) head sees under a window of `left` keys left of
// the diagonal (and none right of it when causal).
double visible_scores(int seqlen, bool causal, int left) {
  double n = 0;
  for (int i = 0; i < seqlen; ++i) {
    const int first = std::max(0, i - left);
    n += (causal ? i + 1 : seqlen) - first;
  }
  return n;
}

struct Record {
  flash3::DType dtype;
  int headdim, causal, batch, seqlen, heads;
  int headdim_v = 0;  // v's and out's
  double ms_median = 0, tflops = 0;
  double quant_ms = 0;  // fp8: quantizing q, k, v (V into its layout) from bf16, median
  // fp8: the quantize step's memory traffic per second (bf16 q, k, v read, e4m3 written: 9
  // bytes an element), and a device-to-device copy's in the same cell
  // (q into out: 4 bytes an element read and written), GB/s.
  double quant_gbps = 0, copy_gbps = 0;
  std::string error;    // empty when the cell ran
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "flash3_bench: %s\n%s", message.c_str(), kUsage);
  std::exit(kExitUsage);
}

// "all" -> `all`; else a comma-separated list of positive integers.
std::vector<int> parse_ints(const std::string& flag, const std::string& text,
                            const std::vector<int>& all) {
  if (text == "all") {
    return all;
  }
  std::vector<int> values;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const long value = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value < 0 || value > (1 << 30)) {
      usage_error(flag + ": '" + text + "' is not a list of integers or 'all'");
    }
    values.push_back(static_cast<int>(value));
  }
  return values;
}

int parse_int(const std::string& flag, const std::string& text) {
  const std::vector<int> values = parse_ints(flag, text, {});
  if (values.size() != 1) {
    usage_error(flag + " takes one integer");
  }
  return values[0];
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--backward" || flag == "--deterministic" || flag == "--sinks") {
      (flag == "--backward" ? o.backward : flag == "--sinks" ? o.sinks : o.deterministic) = true;
      continue;
    }
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(kExitOk);
    }
    if (i + 1 >= argc) {
      usage_error(flag + " needs a value");
    }
    const std::string value = argv[++i];
    if (flag == "--dtype") {
      if (value == "bf16") {
        o.dtypes = {flash3::DType::kBFloat16};
      } else if (value == "fp16") {
        o.dtypes = {flash3::DType::kFloat16};
      } else if (value == "fp8") {
        o.dtypes = {flash3::DType::kFloat8E4M3};
      } else if (value != "all") {
        usage_error("--dtype must be bf16, fp16, fp8 or all");
      }
    } else if (flag == "--headdim") {
      o.headdims = parse_ints(flag, value, o.headdims);
    } else if (flag == "--causal") {
      o.causals = parse_ints(flag, value, o.causals);
    } else if (flag == "--seqlen") {
      o.seqlens = parse_ints(flag, value, o.seqlens);
    } else if (flag == "--warmup") {
      o.warmup = parse_int(flag, value);
    } else if (flag == "--batch") {
      o.batch = parse_int(flag, value);
      if (o.batch < 1) {
        usage_error("--batch must be at least 1");
      }
    } else if (flag == "--iters") {
      o.iters = parse_int(flag, value);
    } else if (flag == "--fp8-scales") {
      if (value != "block" && value != "head") {
        usage_error("--fp8-scales must be block or head");
      }
      o.fp8_head_scales = value == "head";
    } else if (flag == "--headdim-v") {
      o.headdim_v = parse_int(flag, value);
      if (o.headdim_v < 1 || o.headdim_v > kHidden) {
        usage_error("--headdim-v must be within 1.." + std::to_string(kHidden));
      }
    } else if (flag == "--window") {
      o.window_left = parse_int(flag, value);
      if (o.window_left < 0) {
        usage_error("--window must be 0 or more");
      }
    } else if (flag == "--softcap") {
      char* end = nullptr;
      o.softcap = std::strtof(value.c_str(), &end);
      if (end == value.c_str() || *end != '\0' || !(o.softcap > 0.0f)) {
        usage_error("--softcap takes a number above 0");
      }
    } else if (flag == "--json") {
      o.json_path = value;
    } else if (flag == "--commit") {
      o.commit = value;
    } else {
      usage_error("unknown option " + flag);
    }
  }
  for (int c : o.causals) {
    if (c != 0 && c != 1) {
      usage_error("--causal must be 0, 1 or all");
    }
  }
  for (int d : o.headdims) {
    if (d <= 0 || d > kHidden) {
      usage_error("--headdim " + std::to_string(d) + " is not within 1.." +
                  std::to_string(kHidden));
    }
  }
  if (o.iters < 1 || std::count(o.seqlens.begin(), o.seqlens.end(), 0) > 0) {
    usage_error("--iters and every --seqlen must be at least 1");
  }
  return o;
}

// "" if device 0 is a Hopper GPU, else why not.
std::string hopper_problem(cudaDeviceProp* prop) {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    return std::string("no CUDA device (") + cudaGetErrorString(err) + ")";
  }
  if (count == 0) {
    return "no CUDA device";
  }
  cudaGetDeviceProperties(prop, 0);
  if (prop->major != 9 || prop->minor != 0) {
    return std::string(prop->name) + " is sm_" + std::to_string(prop->major * 10 + prop->minor) +
           ", not a Hopper (sm_90) GPU";
  }
  return "";
}

// Standard normal samples from a counter hash (splitmix64) and Box-Muller: no curand.
__device__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <class T>
__global__ void fill_normal(T* data, int64_t n, uint64_t seed) {
  constexpr float kTwoPi = 6.2831853071795864f;
  constexpr float kTwoToMinus32 = 2.3283064365386963e-10f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t bits = splitmix64(seed ^ splitmix64(i));
    const float u1 = (static_cast<uint32_t>(bits) + 1.0f) * kTwoToMinus32;  // (0, 1]
    const float u2 = static_cast<uint32_t>(bits >> 32) * kTwoToMinus32;     // [0, 1)
    data[i] = static_cast<T>(sqrtf(-2.0f * logf(u1)) * cosf(kTwoPi * u2));
  }
}

void fill(void* data, flash3::DType dtype, int64_t n, uint64_t seed, cudaStream_t stream) {
  constexpr int kThreads = 256, kBlocks = 1024;
  if (dtype == flash3::DType::kBFloat16) {
    fill_normal<<<kBlocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(data), n, seed);
  } else {
    fill_normal<<<kBlocks, kThreads, 0, stream>>>(static_cast<__half*>(data), n, seed);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Median milliseconds of `iters` calls of `call` (after `warmup`), or the first error.
template <class Call>
flash3::Status time_median(Call call, int warmup, int iters, cudaStream_t stream, double* ms) {
  for (int i = 0; i < warmup; ++i) {
    if (flash3::Status s = call(); !s) {
      return s;
    }
  }
  std::vector<cudaEvent_t> start(iters), stop(iters);
  for (int i = 0; i < iters; ++i) {
    cudaEventCreate(&start[i]);
    cudaEventCreate(&stop[i]);
  }
  flash3::Status status;
  for (int i = 0; i < iters && status; ++i) {
    cudaEventRecord(start[i], stream);
    status = call();
    cudaEventRecord(stop[i], stream);
  }
  if (cudaError_t err = cudaStreamSynchronize(stream); status && err != cudaSuccess) {
    status = {flash3::StatusCode::kCudaError, cudaGetErrorString(err)};
  }
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    float t = 0;
    cudaEventElapsedTime(&t, start[i], stop[i]);
    times.push_back(t);
    cudaEventDestroy(start[i]);
    cudaEventDestroy(stop[i]);
  }
  *ms = median(times);
  return status;
}

const char* dtype_name(flash3::DType dtype) {
  return dtype == flash3::DType::kBFloat16 ? "bf16"
         : dtype == flash3::DType::kFloat16 ? "fp16"
                                             : "fp8";
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
    }
    out += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
  }
  return out + "\"";
}

bool write_json(const std::string& path, const Options& o, const cudaDeviceProp& prop,
                const std::vector<Record>& records) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return false;
  }
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  std::fprintf(f,
               "{\"meta\": {\"tool\": \"flash3_bench\", \"device\": %s, \"date\": \"%s\", "
               "\"commit\": %s, \"flash3_version\": \"%s\", \"cuda_runtime\": %d, "
               "\"cuda_driver\": %d, \"warmup\": %d, \"iters\": %d, \"fp8_scales\": \"%s\"},\n"
               " \"records\": [",
               json_string(prop.name).c_str(), date,
               o.commit.empty() ? "null" : json_string(o.commit).c_str(), flash3::version(),
               runtime, driver, o.warmup, o.iters, o.fp8_head_scales ? "head" : "block");
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    std::fprintf(f,
                 "%s\n  {\"dtype\": \"%s\", \"headdim\": %d, \"headdim_v\": %d, \"causal\": %s, "
                 "\"batch\": %d, \"seqlen\": %d, \"heads\": %d, ",
                 i ? "," : "", dtype_name(r.dtype), r.headdim, r.headdim_v,
                 r.causal ? "true" : "false", r.batch, r.seqlen, r.heads);
    if (r.error.empty()) {
      std::fprintf(f, "\"ms_median\": %.6f, \"tflops\": %.3f", r.ms_median, r.tflops);
      if (r.dtype == flash3::DType::kFloat8E4M3) {
        std::fprintf(f, ", \"quant_ms\": %.6f, \"quant_gbps\": %.1f, \"copy_gbps\": %.1f",
                     r.quant_ms, r.quant_gbps, r.copy_gbps);
      }
      std::fprintf(f, "}");
    } else {
      std::fprintf(f, "\"ms_median\": null, \"tflops\": null, \"error\": %s}",
                   json_string(r.error).c_str());
    }
  }
  std::fprintf(f, "\n]}\n");
  return std::fclose(f) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  cudaDeviceProp prop{};
  if (std::string problem = hopper_problem(&prop); !problem.empty()) {
    std::fprintf(stderr, "flash3_bench: needs a Hopper (sm_90) GPU: %s\n", problem.c_str());
    return kExitNoHopper;
  }
  // One allocation per tensor, big enough for every cell: cells use a prefix.
  const int64_t max_seqlen = *std::max_element(o.seqlens.begin(), o.seqlens.end());
  const int64_t max_tokens = std::max<int64_t>(kTokens, max_seqlen) * std::max(1, o.batch);
  const int64_t max_heads = kHidden / *std::min_element(o.headdims.begin(), o.headdims.end());
  // A row of v and out is heads x v's head dim: wider than kHidden where v's head dim is
  // larger than q's (--headdim 64 --headdim-v 256).
  const int64_t elements = max_tokens * std::max<int64_t>(kHidden, max_heads * o.headdim_v);
  void *q, *k, *v, *out;
  float* lse;
  cudaStream_t stream;
  for (void** p : {&q, &k, &v, &out}) {
    if (cudaMalloc(p, elements * sizeof(__half)) != cudaSuccess) {
      std::fprintf(stderr, "flash3_bench: cudaMalloc of %lld elements failed\n",
                   static_cast<long long>(elements));
      return kExitCallFailed;
    }
  }
  // FP8: e4m3 q, k, V in its layout (seqlen padded to 16), the descales.
  void *q8, *k8, *v_layout;
  float *dq, *dk, *dv;
  const int64_t descales = max_tokens * max_heads;
  for (void** p : {&q8, &k8, &v_layout}) {
    if (cudaMalloc(p, 2 * elements) != cudaSuccess) {  // >= padded V for any seqlen
      std::fprintf(stderr, "flash3_bench: cudaMalloc of the fp8 buffers failed\n");
      return kExitCallFailed;
    }
  }
  for (float** p : {&dq, &dk, &dv}) {
    if (cudaMalloc(p, descales * sizeof(float)) != cudaSuccess) {
      std::fprintf(stderr, "flash3_bench: cudaMalloc of the descales failed\n");
      return kExitCallFailed;
    }
  }
  // Backward: dout and the gradients (16-bit, like q), and the workspace.
  void *dout = nullptr, *grad_q = nullptr, *grad_k = nullptr, *grad_v = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  if (o.backward) {
    for (void** p : {&dout, &grad_q, &grad_k, &grad_v}) {
      if (cudaMalloc(p, elements * sizeof(__half)) != cudaSuccess) {
        std::fprintf(stderr, "flash3_bench: cudaMalloc of the backward buffers failed\n");
        return kExitCallFailed;
      }
    }
  }
  float* sinks = nullptr;
  if (o.sinks && (cudaMalloc(&sinks, max_heads * sizeof(float)) != cudaSuccess ||
                  cudaMemset(sinks, 0, max_heads * sizeof(float)) != cudaSuccess)) {
    std::fprintf(stderr, "flash3_bench: cannot allocate the sinks\n");
    return kExitCallFailed;
  }
  if (cudaMalloc(&lse, max_tokens * max_heads * sizeof(float)) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    std::fprintf(stderr, "flash3_bench: cannot allocate the log-sum-exp or a stream\n");
    return kExitCallFailed;
  }

  std::printf("flash3 %s %s on %s, median of %d calls after %d warm-up", flash3::version(),
              o.backward ? (o.deterministic ? "backward (deterministic)" : "backward") : "forward",
              prop.name, o.iters, o.warmup);
  if (std::count(o.dtypes.begin(), o.dtypes.end(), flash3::DType::kFloat8E4M3) > 0) {
    if (o.fp8_head_scales) {
      std::printf("; fp8 descales per (batch, head)");
    } else {
      std::printf("; fp8 descales per %d rows", kFp8BlockRows);
    }
  }
  if (o.headdim_v > 0) {
    std::printf("; v head dim %d", o.headdim_v);
  }
  std::printf("\n");
  std::printf("%-5s %5s %6s %5s %6s %5s %10s %8s\n", "dtype", "hdim", "causal", "batch",
              "seqlen", "heads", "ms", "TFLOP/s");
  std::vector<Record> records;
  int exit_code = kExitOk;
  for (flash3::DType dtype : o.dtypes) {
    uint64_t seed = 0;
    const bool fp8 = dtype == flash3::DType::kFloat8E4M3;
    const flash3::DType in_dtype = fp8 ? flash3::DType::kBFloat16 : dtype;
    for (void* p : {q, k, v}) {
      fill(p, in_dtype, elements, ++seed, stream);
    }
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
      std::fprintf(stderr, "flash3_bench: filling the inputs failed: %s\n", cudaGetErrorString(err));
      return kExitCallFailed;
    }
    for (int headdim : o.headdims) {
      for (int causal : o.causals) {
        for (int seqlen : o.seqlens) {
          const int batch =
              o.batch > 0 ? o.batch : static_cast<int>(std::max<int64_t>(1, kTokens / seqlen));
          Record r{dtype, headdim, causal, batch, seqlen, static_cast<int>(kHidden / headdim)};
          r.headdim_v = o.headdim_v > 0 ? o.headdim_v : headdim;
          const auto tensor = [&](void* data, flash3::DType t, int d) {
            return flash3::Tensor::contiguous(data, t, r.batch, seqlen, r.heads, d);
          };
          const flash3::Tensor tq = tensor(q, in_dtype, headdim), tk = tensor(k, in_dtype, headdim),
                               tv = tensor(v, in_dtype, r.headdim_v),
                               to = tensor(out, in_dtype, r.headdim_v);
          flash3::ForwardOptions options;
          options.causal = causal != 0;
          options.window_left = o.window_left;
          options.softcap = o.softcap;
          options.sinks = sinks;
          flash3::Status s;
          if (o.backward && !fp8) {
            flash3::BackwardOptions bo;
            bo.causal = options.causal;
            bo.window_left = o.window_left;
            bo.softcap = o.softcap;
            bo.deterministic = o.deterministic;
            size_t need = 0;
            s = flash3::backward_workspace_size(tq, tk, bo, &need);
            if (s && need > workspace_bytes) {
              cudaFree(workspace);
              workspace_bytes = cudaMalloc(&workspace, need) == cudaSuccess ? need : 0;
            }
            bo.workspace = workspace;
            bo.workspace_bytes = workspace_bytes;
            const flash3::Tensor tdo = tensor(dout, in_dtype, r.headdim_v),
                                 tdq = tensor(grad_q, in_dtype, headdim),
                                 tdk = tensor(grad_k, in_dtype, headdim),
                                 tdv = tensor(grad_v, in_dtype, r.headdim_v);
            if (s) {
              fill(dout, in_dtype, static_cast<int64_t>(r.batch) * seqlen * kHidden, ++seed,
                   stream);
              s = flash3::forward(tq, tk, tv, to, lse, options, stream);
            }
            if (s) {
              s = time_median(
                  [&] {
                    return flash3::backward(tdo, tq, tk, tv, to, lse, tdq, tdk, tdv, bo, stream);
                  },
                  o.warmup, o.iters, stream, &r.ms_median);
            }
          } else if (!fp8) {
            s = time_median([&] { return flash3::forward(tq, tk, tv, to, lse, options, stream); },
                            o.warmup, o.iters, stream, &r.ms_median);
          } else {
            const flash3::DType e4m3 = flash3::DType::kFloat8E4M3;
            const flash3::Tensor tq8 = tensor(q8, e4m3, headdim), tk8 = tensor(k8, e4m3, headdim);
            const flash3::Fp8V tvl{v_layout, r.batch, seqlen, r.heads, headdim};
            const int block_rows = o.fp8_head_scales ? seqlen : kFp8BlockRows;
            const flash3::QuantizeOptions qk_quant{block_rows, true, 1234};
            const flash3::QuantizeOptions v_quant{block_rows, false, 0};
            const flash3::Fp8Descales d{{dq, block_rows}, {dk, block_rows}, {dv, block_rows}};
            const auto quantize = [&]() -> flash3::Status {
              for (flash3::Status st : {flash3::quantize_fp8(tq, tq8, dq, qk_quant, stream),
                                        flash3::quantize_fp8(tk, tk8, dk, qk_quant, stream),
                                        flash3::quantize_fp8_v(tv, tvl, dv, v_quant, stream)}) {
                if (!st) {
                  return st;
                }
              }
              return {};
            };
            s = time_median(quantize, o.warmup, o.iters, stream, &r.quant_ms);
            const double elements = static_cast<double>(r.batch) * seqlen * kHidden;
            double copy_ms = 0;
            if (s) {
              s = time_median(
                  [&]() -> flash3::Status {
                    const cudaError_t err =
                        cudaMemcpyAsync(out, q, static_cast<size_t>(elements) * 2,
                                        cudaMemcpyDeviceToDevice, stream);
                    if (err != cudaSuccess) {
                      return {flash3::StatusCode::kCudaError, cudaGetErrorString(err)};
                    }
                    return {};
                  },
                  o.warmup, o.iters, stream, &copy_ms);
              r.quant_gbps = 9.0 * elements / (r.quant_ms * 1e-3) / 1e9;
              r.copy_gbps = 4.0 * elements / (copy_ms * 1e-3) / 1e9;
            }
            if (s) {
              s = time_median(
                  [&] {
                    return flash3::forward_fp8(tq8, tk8, tvl, to, lse, d, options, stream);
                  },
                  o.warmup, o.iters, stream, &r.ms_median);
            }
          }
          std::printf("%-5s %5d %6d %5d %6d %5d ", dtype_name(dtype), headdim, causal, r.batch,
                      seqlen, r.heads);
          if (s) {
            const double scores = o.window_left < 0
                                      ? double(seqlen) * seqlen / (causal ? 2 : 1)
                                      : visible_scores(seqlen, causal != 0, o.window_left);
            // Q K^T and P V: 2 (d + dv) a score forward; the backward 2.5x that.
            const double flops = (o.backward ? 5.0 : 2.0) * (headdim + r.headdim_v) *
                                 r.batch * r.heads * scores;
            r.tflops = flops / (r.ms_median * 1e-3) / 1e12;
            std::printf("%10.4f %8.1f", r.ms_median, r.tflops);
            if (fp8) {
              std::printf("   quantize %.4f ms (%.0f GB/s, copy %.0f), end to end %.1f TFLOP/s",
                          r.quant_ms, r.quant_gbps, r.copy_gbps,
                          flops / ((r.ms_median + r.quant_ms) * 1e-3) / 1e12);
            }
            std::printf("\n");
          } else {
            r.error = s.message;
            exit_code = kExitCallFailed;
            std::printf("failed: %s\n", s.message.c_str());
          }
          std::fflush(stdout);
          records.push_back(r);
        }
      }
    }
  }
  if (!o.json_path.empty() && !write_json(o.json_path, o, prop, records)) {
    std::fprintf(stderr, "flash3_bench: cannot write %s\n", o.json_path.c_str());
    exit_code = kExitCallFailed;
  }
  return exit_code;
}
