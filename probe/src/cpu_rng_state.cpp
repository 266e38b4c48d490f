#include "nanscope/probe/cpu_rng_state.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <utility>

namespace nanscope {

// What get_state() serializes: the engine and the normal samples the
// generator caches (the second of each Box-Muller pair).
struct CpuRngState::Position {
  at::mt19937 engine;
  // c10::optional in LibTorch 1.13, std::optional in 2.x.
  decltype(std::declval<at::CPUGeneratorImpl&>().next_float_normal_sample()) next_float;
  decltype(std::declval<at::CPUGeneratorImpl&>().next_double_normal_sample()) next_double;

  void read(at::CPUGeneratorImpl& generator) {
    engine = generator.engine();
    next_float = generator.next_float_normal_sample();
    next_double = generator.next_double_normal_sample();
  }
  void write(at::CPUGeneratorImpl& generator) const {
    generator.set_engine(engine);
    generator.set_next_float_normal_sample(next_float);
    generator.set_next_double_normal_sample(next_double);
  }
  bool operator==(const Position& other) const {
    const at::mt19937_data_pod a = engine.data(), b = other.engine.data();
    return a.seed_ == b.seed_ && a.left_ == b.left_ && a.seeded_ == b.seeded_ && a.next_ == b.next_ &&
           a.state_ == b.state_ && next_float == other.next_float && next_double == other.next_double;
  }
};

namespace {

// The default generator, locked as PyTorch locks it around get_state()/set_state().
template <class Use>
auto with_default_generator(const Use& use) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(generator.mutex());
  return use(*at::check_generator<at::CPUGeneratorImpl>(generator));
}

}  // namespace

CpuRngState CpuRngState::now() {
  CpuRngState state;
  state.take_now();
  return state;
}

CpuRngState CpuRngState::from_bytes(const at::Tensor& bytes) {
  if (!bytes.defined()) return {};
  // A generator of its own reads the bytes (set_state checks their size), so
  // the default one is not disturbed.
  at::Generator scratch = at::detail::createCPUGenerator();
  scratch.set_state(bytes);
  auto position = std::make_shared<Position>();
  position->read(*at::check_generator<at::CPUGeneratorImpl>(scratch));
  return CpuRngState(std::move(position));
}

void CpuRngState::take_now() {
  if (!position_ || position_.use_count() > 1) position_ = std::make_shared<Position>();
  with_default_generator([&](at::CPUGeneratorImpl& generator) { position_->read(generator); });
}

void CpuRngState::restore() const {
  if (!position_) return;
  with_default_generator([&](at::CPUGeneratorImpl& generator) { position_->write(generator); });
}

bool CpuRngState::is_current() const {
  if (!position_) return false;
  Position current;
  with_default_generator([&](at::CPUGeneratorImpl& generator) { current.read(generator); });
  return current == *position_;
}

at::Tensor CpuRngState::bytes() const {
  if (!position_) return {};
  at::Generator scratch = at::detail::createCPUGenerator();
  position_->write(*at::check_generator<at::CPUGeneratorImpl>(scratch));
  return scratch.get_state();
}

int64_t CpuRngState::size_bytes() const { return position_ ? int64_t(sizeof(Position)) : 0; }

}  // namespace nanscope
