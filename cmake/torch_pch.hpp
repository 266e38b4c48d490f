// The LibTorch headers nanscope's TUs use, precompiled once per target.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn.h>
#include <torch/optim.h>
#include <torch/script.h>
