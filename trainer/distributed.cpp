#include "nanscope/trainer/distributed.hpp"

#include "nanscope/common/error_text.hpp"

#include <c10/util/Exception.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#ifdef NANSCOPE_HAVE_C10D_GLOO
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif
#ifdef NANSCOPE_HAVE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace nanscope::trainer {

namespace {}  // namespace

#ifdef NANSCOPE_HAVE_C10D_GLOO

namespace {

// LibTorch 1.x's process groups are c10d::ProcessGroup; 2.x split them into a
// ProcessGroup front and per-device c10d::Backend objects, which is what
// ProcessGroupGloo/NCCL are there. Both have the collectives used here.
#if TORCH_VERSION_MAJOR >= 2
using Collectives = c10d::Backend;
#else
using Collectives = c10d::ProcessGroup;
#endif
using WorkPtr = decltype(std::declval<Collectives&>().barrier());

// LibTorch 2.x's TCPStore defaults to a libuv server that Debian's build does
// not have ("use_libuv was requested but PyTorch was build without libuv
// support"); the wheels do. Try the default, then the classic server.
template <typename Options>
auto prefer_classic_store(Options& o, int) -> decltype(o.useLibUV = false, void()) {
  o.useLibUV = false;
}
template <typename Options>
void prefer_classic_store(Options&, long) {}

c10::intrusive_ptr<c10d::Store> make_store(const DistOptions& d) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(d.master_port);
  // Upstream torchrun's agent already hosts the store at MASTER_PORT and says
  // so in TORCHELASTIC_USE_AGENT_STORE; then rank 0 is a client like the rest.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  options.isServer = d.rank == 0 && !(agent_store && std::string(agent_store) == "True");
  options.numWorkers = static_cast<std::size_t>(d.world_size);
  options.waitWorkers = true;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(d.timeout_s * 1000));
  try {
    return c10::make_intrusive<c10d::TCPStore>(d.master_addr, options);
  } catch (const c10::Error& e) {
    if (std::strstr(e.what(), "libuv") == nullptr) throw;
    prefer_classic_store(options, 0);
    return c10::make_intrusive<c10d::TCPStore>(d.master_addr, options);
  }
}

// The interface this rank's Gloo pairs listen on, chosen as torch.distributed
// chooses it: GLOO_SOCKET_IFNAME when set; every rank on this machine when the
// rendezvous is on loopback; else the address this host's name resolves to.
std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr) {
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface && *interface)
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  if (master_addr == "localhost" || master_addr.rfind("127.", 0) == 0)
    return c10d::ProcessGroupGloo::createDeviceForHostname(master_addr);
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<Collectives> group;
};

std::unique_ptr<ProcessGroup> ProcessGroup::connect(const DistOptions& d, at::Device device) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(d.timeout_s * 1000));
  DistBackend backend =
      d.backend == DistBackend::automatic ? (device.is_cuda() ? DistBackend::nccl : DistBackend::gloo) : d.backend;
#ifndef NANSCOPE_HAVE_C10D_NCCL
  // Gloo reduces CUDA tensors too.
  if (backend == DistBackend::nccl && d.backend == DistBackend::automatic) backend = DistBackend::gloo;
  if (backend == DistBackend::nccl)
    throw std::invalid_argument("--dist-backend nccl: this LibTorch was built without CUDA/NCCL");
#endif
  // LibTorch 2.x's c10d logs every rendezvous retry (a rank that starts
  // before rank 0's store is up: normal) as a warning with a C++ backtrace.
  // Errors only, unless the user asked for more.
  setenv("TORCH_CPP_LOG_LEVEL", "ERROR", /*overwrite=*/0);
  auto impl = std::make_unique<Impl>();
  try {
    impl->store = make_store(d);
    if (backend == DistBackend::gloo) {
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      options->devices.push_back(gloo_device(d.master_addr));
      impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, d.rank, d.world_size, options);
    } else {
#ifdef NANSCOPE_HAVE_C10D_NCCL
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout;
      impl->group = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl->store, d.rank, d.world_size, options);
#endif
    }
  } catch (const std::exception& e) {
    throw DistributedError("rank " + std::to_string(d.rank) + " of " + std::to_string(d.world_size) +
                           ": rendezvous at " + d.master_addr + ":" + std::to_string(d.master_port) +
                           " failed (all ranks must start within --dist-timeout " + std::to_string(int(d.timeout_s)) +
                           " s): " + one_line_error(e));
  }
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(impl), d.rank, d.world_size, to_string(backend)));
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl, int rank, int world_size, std::string backend)
    : impl_(std::move(impl)), rank_(rank), world_size_(world_size), backend_(std::move(backend)) {}

ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::all_reduce(const std::vector<at::Tensor>& tensors) {
  try {
    std::vector<WorkPtr> pending;
    pending.reserve(tensors.size());
    for (const at::Tensor& t : tensors) {
      std::vector<at::Tensor> one{t};
      pending.push_back(impl_->group->allreduce(one));
      ++issued_;
    }
    for (auto& work : pending) work->wait();
  } catch (const std::exception& e) {
    fail("all-reduce", e);
  }
}

void ProcessGroup::broadcast(const std::vector<at::Tensor>& tensors) {
  try {
    std::vector<WorkPtr> pending;
    for (const at::Tensor& t : tensors) {
      std::vector<at::Tensor> one{t};
      pending.push_back(impl_->group->broadcast(one));
      ++issued_;
    }
    for (auto& work : pending) work->wait();
  } catch (const std::exception& e) {
    fail("broadcast", e);
  }
}

void ProcessGroup::barrier() {
  try {
    ++issued_;
    impl_->group->barrier()->wait();
  } catch (const std::exception& e) {
    fail("barrier", e);
  }
}

#else  // no c10d Gloo in this build: validate() refuses WORLD_SIZE > 1 first

struct ProcessGroup::Impl {};
std::unique_ptr<ProcessGroup> ProcessGroup::connect(const DistOptions&, at::Device) {
  throw std::invalid_argument("this nanscope-train was built without c10d Gloo");
}
ProcessGroup::~ProcessGroup() = default;
void ProcessGroup::all_reduce(const std::vector<at::Tensor>&) {}
void ProcessGroup::broadcast(const std::vector<at::Tensor>&) {}
void ProcessGroup::barrier() {}

#endif

void ProcessGroup::fail(const char* what, const std::exception& e) const {
  throw DistributedError("rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) + ": " +
                         (context_.empty() ? "" : context_ + ": ") + what +
                         " failed: another rank died or did not answer within --dist-timeout (" + one_line_error(e) +
                         ")");
}

}  // namespace nanscope::trainer
