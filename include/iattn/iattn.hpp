// iattn/iattn.hpp: the umbrella header. Operators, algebra and the CPU evaluation of
// implicit attention:  y = H(x) x + beta(x).
#pragma once

#include "core/backend.hpp"
#include "core/coefficient.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/traits.hpp"
#include "evaluate.hpp"
#include "ops/causal_conv.hpp"
#include "ops/diagonal.hpp"
#include "ops/flip.hpp"
#include "ops/group_norm.hpp"
#include "ops/identity.hpp"
#include "ops/linear_recurrence.hpp"
#include "ops/product.hpp"
#include "ops/row_normalize.hpp"
#include "ops/scaled.hpp"
#include "ops/semiseparable.hpp"
#include "ops/softmax_attention.hpp"
#include "ops/sum.hpp"
#include "ops/wkv.hpp"
#include "version.hpp"
