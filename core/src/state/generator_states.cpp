#include "nanscope/core/generator_states.hpp"

#include "nanscope/common/log_line.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <iostream>

namespace nanscope {

namespace {

int cuda_devices() { return at::hasCUDA() ? int(at::detail::getCUDAHooks().getNumGPUs()) : 0; }

at::Generator cuda_generator(int index) {
  return at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index)));
}

}  // namespace

GeneratorStates GeneratorStates::now() {
  GeneratorStates s;
  s.cpu = at::detail::getDefaultCPUGenerator().get_state();
  for (int i = 0; i < cuda_devices(); ++i) s.cuda.push_back(cuda_generator(i).get_state());
  return s;
}

void GeneratorStates::restore() const {
  if (cpu.defined()) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(cpu);
  }
  for (size_t i = 0; i < cuda.size(); ++i) {
    at::Generator generator = cuda_generator(int(i));
    generator.set_state(cuda[i]);
  }
}

KeepGeneratorStates::~KeepGeneratorStates() {
  if (!armed_) return;
  try {
    states_.restore();
  } catch (const std::exception& e) {
    // A destructor must not throw; the loop's next draws then differ, said once here.
    write_log_line({std::string("nanscope: could not put the random generators back: ") + e.what(), -1, 0, "", true},
                   &std::cerr);
  }
}

}  // namespace nanscope
