// Test scaffolding, not part of the integration: plants faults into chosen
// training examples, as a corrupt or extreme sample would bring them. The
// test suite sets NANSCOPE_MNIST_FAULTS, e.g. "nan@130,max@700": example 130
// (counted over every epoch, in the sequential sampler's order) gets a NaN
// pixel; example 700 has every pixel at the largest float, which autocast's
// cast to bf16 turns into infinity inside conv1. Unset: nothing is planted.
#pragma once
#include <torch/torch.h>

#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>

struct PlantFaults : torch::data::transforms::Transform<torch::data::Example<>, torch::data::Example<>> {
  PlantFaults() {
    const char* spec = std::getenv("NANSCOPE_MNIST_FAULTS");
    std::istringstream items(spec ? spec : "");
    for (std::string item; std::getline(items, item, ',');) {
      const size_t at = item.find('@');
      if (at != std::string::npos) faults[std::stoll(item.substr(at + 1))] = item.substr(0, at);
    }
  }
  torch::data::Example<> apply(torch::data::Example<> example) override {
    const int64_t index = (*seen)++;
    auto it = faults.find(index);
    if (it == faults.end()) return example;
    torch::Tensor image = example.data.clone();
    if (it->second == "nan") image[0][14][14] = std::numeric_limits<float>::quiet_NaN();
    if (it->second == "max") image.fill_(std::numeric_limits<float>::max());
    return {image, example.target};
  }
  std::map<int64_t, std::string> faults;
  std::shared_ptr<int64_t> seen = std::make_shared<int64_t>(0);  // shared by the dataset's copies
};
