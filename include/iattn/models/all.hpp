// iattn/models/all.hpp: every model helper (namespace iattn::models). Include one model's header
// instead to compile less.
#pragma once

#include "deltanet.hpp"
#include "deltaproduct.hpp"
#include "gla.hpp"
#include "griffin.hpp"
#include "hgrn.hpp"
#include "hgrn2.hpp"
#include "hyena.hpp"
#include "kimi_linear.hpp"
#include "linear_attention.hpp"
#include "mamba.hpp"
#include "mamba2.hpp"
#include "mlstm.hpp"
#include "qwen3_next.hpp"
#include "retnet.hpp"
#include "rwkv4.hpp"
#include "rwkv6.hpp"
#include "rwkv7.hpp"
#include "s4d.hpp"
#include "transformer.hpp"
#include "vision_mamba.hpp"
