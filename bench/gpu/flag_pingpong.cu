// The GPU hand-over between two processes, as a replayed decode step does it per MoE layer: the
// "router" raises a layer's input flag and waits for its output flag, the "worker" waits for the
// input flag, clears it, raises the output flag; flags live in the router's device memory,
// shared by CUDA IPC, and each side replays one CUDA graph of `layers` hand-overs. Prints
// microseconds per hand-over (router -> worker -> router) for
//   memop   front-end waits (cuStreamWaitValue32), as strata ships
//   kernel  one-thread polling kernels for the waits
//   local   memop waits between two streams of one process (no IPC): the baseline
// with an optional busy kernel of --work-us on each side standing in for a layer's work, and
// the operations around each hand-over (--chain):
//   bare    the flags alone
//   strata  as a replayed step has them now: router: work (attention), input copy, routing
//           split, raise, wait, clear, combine; worker: wait, clear, work (gate/up), down, raise
//   folded  the signalling folded into kernels: router: work, a split kernel that copies the
//           input and raises the flag, a combine kernel that waits and clears; worker: a kernel
//           that waits and clears, work, a down kernel that raises the output flag. Its waits
//           are polling kernels whatever --mode says (Strata kept front-end waits instead).
// Run it with and without the MPS daemon to compare. Build: bench/gpu/build_flag_pingpong.sh.
//   flag_pingpong [--layers 48] [--reps 100] [--work-us 0] [--mode memop|kernel|local]
//                 [--chain bare|strata|folded]
#include <cuda.h>
#include <cuda_runtime.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace {

#define CHECK(x)                                                                      \
  do {                                                                                \
    const cudaError_t e = (x);                                                        \
    if (e != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)
#define CHECK_CU(x)                                                          \
  do {                                                                       \
    const CUresult r = (x);                                                  \
    if (r != CUDA_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s:%d %s: error %d\n", __FILE__, __LINE__, #x, r); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

__global__ void Busy(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void Poll(const volatile uint32_t* flag, uint32_t value) {
  while (*flag != value) __nanosleep(32);
}

__global__ void Tiny() {}

// A split kernel that also copies the layer's input and then raises the worker's flag.
__global__ void CopyAndRaise(const uint4* src, uint4* dst, int n, volatile uint32_t* flag) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    *flag = 1;
  }
}

// A kernel that waits for its flag and clears it before its own work.
__global__ void WaitAndClear(volatile uint32_t* flag) {
  if (threadIdx.x == 0) {
    while (*flag != 1) __nanosleep(32);
    *flag = 0;
  }
  __syncthreads();
}

struct Options {
  int layers = 48, reps = 100;
  double work_us = 0;
  std::string mode = "memop";
  std::string chain = "bare";
};

constexpr int kRowBytes = 4096;  // one token's bf16 hidden state (2048 wide)
uint4* g_src = nullptr;          // this process's stand-ins for the layer's buffers
uint4* g_dst = nullptr;

CUdeviceptr Ptr(const uint32_t* p) { return reinterpret_cast<CUdeviceptr>(p); }

void Wait(cudaStream_t s, const uint32_t* flag, const Options& o) {
  if (o.mode == "kernel") {
    Poll<<<1, 1, 0, s>>>(flag, 1);
  } else {
    CHECK_CU(cuStreamWaitValue32(reinterpret_cast<CUstream>(s), Ptr(flag), 1,
                                 CU_STREAM_WAIT_VALUE_EQ));
  }
}

void Write(cudaStream_t s, uint32_t* flag, uint32_t value) {
  CHECK_CU(cuStreamWriteValue32(reinterpret_cast<CUstream>(s), Ptr(flag), value,
                                CU_STREAM_WRITE_VALUE_DEFAULT));
}

long long WorkCycles(const Options& o) {
  int khz = 0;
  CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  return static_cast<long long>(o.work_us * khz / 1000.0);
}

// One side's graph: the router's (raise input, wait output, clear it) or the worker's.
cudaGraphExec_t Capture(cudaStream_t s, uint32_t* flags, bool router, const Options& o) {
  uint32_t* in = flags;
  uint32_t* out = flags + o.layers;
  const long long cycles = WorkCycles(o);
  if (g_src == nullptr) {
    CHECK(cudaMalloc(&g_src, kRowBytes));
    CHECK(cudaMalloc(&g_dst, kRowBytes));
  }
  const int n16 = kRowBytes / 16;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < o.layers; ++l) {
    const bool strata = o.chain == "strata", folded = o.chain == "folded";
    if (router) {
      if (cycles > 0) Busy<<<1, 1, 0, s>>>(cycles);
      if (folded) {
        CopyAndRaise<<<1, 128, 0, s>>>(g_src, g_dst, n16, in + l);
        WaitAndClear<<<1, 128, 0, s>>>(out + l);
        continue;
      }
      if (strata) {
        CHECK(cudaMemcpyAsync(g_dst, g_src, kRowBytes, cudaMemcpyDeviceToDevice, s));
        Tiny<<<1, 128, 0, s>>>();
      }
      Write(s, in + l, 1);
      Wait(s, out + l, o);
      Write(s, out + l, 0);
      if (strata) Tiny<<<1, 128, 0, s>>>();
    } else {
      if (folded) {
        WaitAndClear<<<1, 128, 0, s>>>(in + l);
        if (cycles > 0) Busy<<<1, 1, 0, s>>>(cycles);
        CopyAndRaise<<<1, 128, 0, s>>>(g_src, g_dst, n16, out + l);
        continue;
      }
      Wait(s, in + l, o);
      Write(s, in + l, 0);
      if (cycles > 0) Busy<<<1, 1, 0, s>>>(cycles);
      if (strata) Tiny<<<1, 128, 0, s>>>();
      Write(s, out + l, 1);
    }
  }
  cudaGraph_t graph;
  CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaGraphDestroy(graph);
  return exec;
}

void RunWorker(const std::string& hex, const Options& o) {
  cudaIpcMemHandle_t handle;
  for (size_t i = 0; i < sizeof(handle); ++i) {
    reinterpret_cast<unsigned char*>(&handle)[i] =
        static_cast<unsigned char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  void* flags = nullptr;
  CHECK(cudaIpcOpenMemHandle(&flags, handle, cudaIpcMemLazyEnablePeerAccess));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraphExec_t exec = Capture(s, static_cast<uint32_t*>(flags), false, o);
  for (int r = 0; r <= o.reps; ++r) CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string child;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--layers") o.layers = std::atoi(value.c_str());
    else if (flag == "--reps") o.reps = std::atoi(value.c_str());
    else if (flag == "--work-us") o.work_us = std::atof(value.c_str());
    else if (flag == "--mode") o.mode = value;
    else if (flag == "--chain") o.chain = value;
    else if (flag == "--child") child = value;
  }
  if (!child.empty()) {
    RunWorker(child, o);
    return 0;
  }
  uint32_t* flags = nullptr;
  CHECK(cudaMalloc(&flags, size_t{2} << 20));
  CHECK(cudaMemset(flags, 0, size_t{2} << 20));
  cudaStream_t s, worker_stream;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  pid_t pid = -1;
  cudaGraphExec_t worker_exec = nullptr;
  if (o.mode == "local") {
    CHECK(cudaStreamCreateWithFlags(&worker_stream, cudaStreamNonBlocking));
    worker_exec = Capture(worker_stream, flags, false, o);
  } else {
    cudaIpcMemHandle_t handle;
    CHECK(cudaIpcGetMemHandle(&handle, flags));
    std::string hex;
    for (size_t i = 0; i < sizeof(handle); ++i) {
      char b[3];
      std::snprintf(b, sizeof(b), "%02x", reinterpret_cast<unsigned char*>(&handle)[i]);
      hex += b;
    }
    const std::string layers = std::to_string(o.layers), reps = std::to_string(o.reps),
                      work = std::to_string(o.work_us);
    std::vector<const char*> args = {argv[0], "--child", hex.c_str(), "--layers", layers.c_str(),
                                     "--reps", reps.c_str(), "--work-us", work.c_str(),
                                     "--mode", o.mode.c_str(), "--chain", o.chain.c_str(),
                                     nullptr};
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, const_cast<char**>(args.data()),
                    environ) != 0) {
      std::perror("posix_spawn");
      return 1;
    }
  }
  cudaGraphExec_t exec = Capture(s, flags, true, o);
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int r = 0; r <= o.reps; ++r) {
    if (worker_exec != nullptr) CHECK(cudaGraphLaunch(worker_exec, worker_stream));
    if (r == 1) CHECK(cudaEventRecord(start, s));  // the first replay warms up
    CHECK(cudaGraphLaunch(exec, s));
  }
  CHECK(cudaEventRecord(stop, s));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  if (pid > 0) waitpid(pid, nullptr, 0);
  const double per = 1000.0 * ms / (static_cast<double>(o.reps) * o.layers);
  std::printf("mode %s, chain %s, %d layers x %d reps, work %.1f us a side: %.2f us per "
              "hand-over (%.2f us beyond the work)\n",
              o.mode.c_str(), o.chain.c_str(), o.layers, o.reps, o.work_us, per,
              per - 2 * o.work_us);
  return 0;
}
