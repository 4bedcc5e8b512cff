// iattn/backend/cuda/kernels/all.hpp: every kernel of the CUDA backend (for the nvcc resource
// check, tests/cuda/kernels.cu, which instantiates each one). Free of Eigen and of host-only code.
#pragma once

#include "band.hpp"
#include "causal_conv.hpp"
#include "chunked_scan.hpp"
#include "complex_scan.hpp"
#include "copy.hpp"
#include "diagonal.hpp"
#include "flip.hpp"
#include "group_norm.hpp"
#include "row_normalize.hpp"
#include "linear_recurrence.hpp"
#include "linear_recurrence_tiles.hpp"
#include "lower_product.hpp"
#include "mean.hpp"
#include "semiseparable_scan.hpp"
#include "semiseparable_tiles.hpp"
#include "semiseparable_view.hpp"
#include "softmax.hpp"
#include "transition.hpp"
#include "vector_scan.hpp"
#include "wkv.hpp"
