// python/src/operators.cpp: iattn.Operator (the operators, composable with *, +, flip, row_normalize),
// their factories, and iattn.Decomposition.
#include "common.hpp"

namespace iattn::py {
namespace {

Index length_arg(const std::optional<Index>& L) { return L ? *L : any; }

/// f(tag) with tag a float or a double, from the dtype of the first array.
template <class F>
decltype(auto) by_dtype(const array_in& a, const std::string& where, const std::string& arg, F&& f) {
  return on_scalar(dtype_of(a, where, arg), std::forward<F>(f));
}

/// The operands of a binary node share a scalar type, or a TypeError says which differ.
const Operator& same_dtype(const Operator& a, const Operator& b, const char* what) {
  if (a.type() != b.type())
    throw nb::type_error((std::string(what) + ": the operands are " + dtype_name(a.type()) + " and " + dtype_name(b.type()) +
                          "; an expression has one scalar type (build both from arrays of one dtype)").c_str());
  return a;
}

nb::object operator_apply(const Operator& op, const array_in& x) {
  return op.visit([&](const auto& H) -> nb::object {
    using T = typename std::remove_cvref_t<decltype(H)>::scalar;
    const Matrix<T> X = to_matrix<T>(x, "apply", "x");
    Matrix<T> Y;
    {
      nb::gil_scoped_release release;
      Y = apply(H, X);
    }
    return to_numpy<T>(std::move(Y));
  });
}

/// Runs f(H) without the GIL and hands its Matrix or Tensor3 result to numpy.
template <class F>
nb::object evaluate(const Operator& op, F&& f) {
  return op.visit([&](const auto& H) -> nb::object {
    using T = typename std::remove_cvref_t<decltype(H)>::scalar;
    std::optional<decltype(f(H))> r;
    {
      nb::gil_scoped_release release;
      r.emplace(f(H));
    }
    return to_numpy<T>(std::move(*r));
  });
}

mean_options mean_opts(bool abs, std::optional<Index> head, std::optional<std::pair<Index, Index>> channels) {
  mean_options o;
  o.abs = abs;
  o.head = head;
  if (channels) o.channels = range{channels->first, channels->second};
  return o;
}

std::string describe(const Operator& op) {
  return op.visit([&](const auto& H) {
    auto ext = [](Index v, const char* l) { return v == any ? std::string(l) + "=any" : std::string(l) + "=" + std::to_string(v); };
    const auto& s = H.structure();
    std::string kind = s.diagonal() ? "diagonal" : s.band > 0 ? "band " + std::to_string(s.band) : s.lower ? "causal" : s.upper ? "anti-causal" : "full";
    return "iattn.Operator(" + ext(H.length(), "L") + ", " + ext(H.channels(), "D") + ", " + dtype_name(op.type()) + ", " + kind +
           (s.head_dim > 0 ? ", head_dim=" + std::to_string(s.head_dim) : std::string()) + (H.bound() ? "" : ", unbound GroupNorm") + ")";
  });
}

// Documentation shared by Operator and Decomposition.
constexpr const char* doc_apply = "H x for x (L, D), per channel y[:, c] = H^c x[:, c]; O(L D N), no L x L matrix is formed.";
constexpr const char* doc_materialize = "Channel c's (L, L) matrix H^c. L is needed only when no coefficient fixes it.";
constexpr const char* doc_mean =
    "The mean over channels of H^c (or of |H^c| with abs=True), (L, L): all channels, one head's (head=h) or\n"
    "channels=(c0, c1). Exact, without per-channel L x L temporaries.";
constexpr const char* doc_head_means = "Every head's mean of H^c (or |H^c|), (heads, L, L): the layout of bertviz's attention maps.";
constexpr const char* doc_all = "Every channel's matrix, (D, L, L).";
constexpr const char* doc_row = "Row t of every channel's matrix, (D, L): what token t reads from each earlier token.";
constexpr const char* doc_col = "Column s of every channel's matrix, (D, L): how token s is read by each later token.";
constexpr const char* doc_block = "The tile H^c[rows[0]:rows[1], cols[0]:cols[1]], for L too large to materialize.";

template <class Cls, class Get>
void def_evaluation(Cls& cls, Get get) {
  cls.def("apply", [get](nb::handle self, const array_in& x) { return operator_apply(get(self), x); }, nb::arg("x"), doc_apply)
      .def(
          "materialize", [get](nb::handle self, Index c, std::optional<Index> L) {
            return evaluate(get(self), [&](const auto& H) { return materialize(H, c, length_arg(L)); });
          },
          nb::arg("c"), nb::arg("L") = nb::none(), doc_materialize)
      .def(
          "mean",
          [get](nb::handle self, bool abs, std::optional<Index> head, std::optional<std::pair<Index, Index>> channels, std::optional<Index> L) {
            const mean_options o = mean_opts(abs, head, channels);
            return evaluate(get(self), [&](const auto& H) { return materialize_mean(H, o, length_arg(L)); });
          },
          nb::kw_only(), nb::arg("abs") = false, nb::arg("head") = nb::none(), nb::arg("channels") = nb::none(), nb::arg("L") = nb::none(),
          doc_mean)
      .def(
          "head_means",
          [get](nb::handle self, bool abs, std::optional<Index> L) {
            return evaluate(get(self), [&](const auto& H) { return materialize_head_means(H, mean_opts(abs, {}, {}), length_arg(L)); });
          },
          nb::kw_only(), nb::arg("abs") = false, nb::arg("L") = nb::none(), doc_head_means)
      .def(
          "materialize_all", [get](nb::handle self, std::optional<Index> L) {
            return evaluate(get(self), [&](const auto& H) { return materialize_all(H, length_arg(L)); });
          },
          nb::arg("L") = nb::none(), doc_all)
      .def(
          "row", [get](nb::handle self, Index t, std::optional<Index> L) {
            return evaluate(get(self), [&](const auto& H) { return row(H, t, length_arg(L)); });
          },
          nb::arg("t"), nb::arg("L") = nb::none(), doc_row)
      .def(
          "col", [get](nb::handle self, Index s, std::optional<Index> L) {
            return evaluate(get(self), [&](const auto& H) { return col(H, s, length_arg(L)); });
          },
          nb::arg("s"), nb::arg("L") = nb::none(), doc_col)
      .def(
          "block",
          [get](nb::handle self, Index c, std::pair<Index, Index> rows, std::pair<Index, Index> cols, std::optional<Index> L) {
            return evaluate(get(self), [&](const auto& H) {
              const Index n = H.length() == any ? length_arg(L) : H.length();
              auto in = [&](std::pair<Index, Index> r, const char* name) {
                if (r.first < 0 || r.second < r.first || (n != any && r.second > n))
                  detail::fail("block", std::string(name) + " = (" + std::to_string(r.first) + ", " + std::to_string(r.second) +
                                            ") is not a range inside [0, L=" + std::to_string(n) + "]");
                return range{r.first, r.second};
              };
              return block(H, c, in(rows, "rows"), in(cols, "cols"), length_arg(L));
            });
          },
          nb::arg("c"), nb::arg("rows"), nb::arg("cols"), nb::arg("L") = nb::none(), doc_block);
}

template <class T>
nb::object view(nb::handle owner, const Matrix<T>& m) {
  const std::size_t shape[2] = {std::size_t(m.rows()), std::size_t(m.cols())};
  return nb::cast(nb::ndarray<nb::numpy, const T, nb::ndim<2>>(m.data(), 2, shape, owner));
}

}  // namespace

void bind_operators(nb::module_& m) {
  auto op = nb::class_<Operator>(m, "Operator",
                                 "A lazy implicit-attention operator: per channel c an (L, L) matrix H^c. Built by the factories\n"
                                 "(diagonal, causal_conv, linear_recurrence, semiseparable, group_norm) and composed with\n"
                                 "A * B (per-channel product), A + B, s * A, flip(A), row_normalize(A). float32 or float64.");
  op.def_prop_ro("dtype", [](const Operator& o) { return std::string(dtype_name(o.type())); }, "'float32' or 'float64'.")
      .def_prop_ro("length", [](const Operator& o) -> std::optional<Index> {
            const Index L = o.visit([](const auto& H) { return H.length(); });
            return L == any ? std::nullopt : std::optional<Index>(L);
          }, "L, or None when no coefficient fixes it (convolutions, constant diagonals).")
      .def_prop_ro("channels", [](const Operator& o) -> std::optional<Index> {
            const Index D = o.visit([](const auto& H) { return H.channels(); });
            return D == any ? std::nullopt : std::optional<Index>(D);
          }, "D, or None when no coefficient fixes it.")
      .def_prop_ro("causal", [](const Operator& o) { return o.visit([](const auto& H) { return H.structure().lower; }); },
                   "Every channel's matrix is lower-triangular (known from the structure).")
      .def_prop_ro("head_dim", [](const Operator& o) { return o.visit([](const auto& H) { return H.structure().head_dim; }); },
                   "P, the channels per head of its Semiseparable nodes (0: no heads, -1: they disagree).")
      .def_prop_ro("bound", [](const Operator& o) { return o.visit([](const auto& H) { return H.bound(); }); },
                   "False while a GroupNorm waits for its statistics (bind(x) fixes them; apply computes them).")
      .def("__repr__", &describe)
      .def("__mul__", [](const Operator& a, const Operator& b) {
            same_dtype(a, b, "A * B");
            return a.visit([&](const auto& A) { return wrap(erase(A * b.as<typename std::remove_cvref_t<decltype(A)>::scalar>())); });
          }, nb::is_operator())
      .def("__mul__", [](const Operator& a, double s) { return a.visit([&](const auto& A) { return wrap(erase(s * A)); }); }, nb::is_operator())
      .def("__rmul__", [](const Operator& a, double s) { return a.visit([&](const auto& A) { return wrap(erase(s * A)); }); }, nb::is_operator())
      .def("__neg__", [](const Operator& a) { return a.visit([&](const auto& A) { return wrap(erase(-1.0 * A)); }); })
      .def("__add__", [](const Operator& a, const Operator& b) {
            same_dtype(a, b, "A + B");
            return a.visit([&](const auto& A) { return wrap(erase(A + b.as<typename std::remove_cvref_t<decltype(A)>::scalar>())); });
          }, nb::is_operator())
      .def("__sub__", [](const Operator& a, const Operator& b) {
            same_dtype(a, b, "A - B");
            return a.visit([&](const auto& A) { return wrap(erase(A + (-1.0) * b.as<typename std::remove_cvref_t<decltype(A)>::scalar>())); });
          }, nb::is_operator())
      .def("flip", [](const Operator& a) { return a.visit([](const auto& A) { return wrap(erase(flip(A))); }); },
           "J H J (J reverses the tokens): the anti-causal mirror, for backward scans.")
      .def("row_normalize", [](const Operator& a) { return a.visit([](const auto& A) { return wrap(erase(row_normalize(A))); }); },
           "Each row of H^c divided by its sum (RWKV's normaliser).")
      .def(
          "bind",
          [](const Operator& a, const array_in& x) {
            return a.visit([&](const auto& A) {
              using T = typename std::remove_cvref_t<decltype(A)>::scalar;
              const Matrix<T> X = to_matrix<T>(x, "bind", "x");
              nb::gil_scoped_release release;
              return wrap(bind(A, X));
            });
          },
          nb::arg("x"), "The operator with every GroupNorm's statistics fixed from the forward pass on x (L, D).");
  def_evaluation(op, [](nb::handle self) -> const Operator& { return nb::cast<const Operator&>(self); });

  m.def("diagonal", [](const array_in& d) {
        return by_dtype(d, "diagonal", "d", [&](auto tag) { using T = decltype(tag); return wrap(erase(diagonal(to_matrix<T>(d, "diagonal", "d", true)))); });
      }, nb::arg("d"), "diag(d): d (L, D), or (D,) / (1, D) for a diagonal constant over tokens.");
  m.def("causal_conv", [](const array_in& w) {
        return by_dtype(w, "causal_conv", "w", [&](auto tag) { using T = decltype(tag); return wrap(erase(causal_conv(to_matrix<T>(w, "causal_conv", "w")))); });
      }, nb::arg("w"), "Depthwise causal convolution with taps w (K, D) in PyTorch's tap order (w[K-1] weighs the current token).");
  m.def("linear_recurrence", [](const array_in& a, const array_in& b) {
        return by_dtype(a, "linear_recurrence", "a", [&](auto tag) {
          using T = decltype(tag);
          return wrap(erase(linear_recurrence(to_matrix<T>(a, "linear_recurrence", "a"), to_matrix<T>(b, "linear_recurrence", "b"))));
        });
      }, nb::arg("a"), nb::arg("b"), "h_t = a_t h_{t-1} + b_t x_t with a, b (L, D): H[t, s] = (a_{s+1} ... a_t) b_s.");
  m.def(
      "semiseparable",
      [](const array_in& log_decay, const array_in& B, const array_in& C, Index heads, Index head_dim, Index groups,
         std::optional<array_in> bonus, bool allow_growth) {
        const char* w = "semiseparable";
        return by_dtype(log_decay, w, "log_decay", [&](auto tag) {
          using T = decltype(tag);
          semiseparable_options o{.heads = heads, .head_dim = head_dim, .groups = groups, .allow_growth = allow_growth};
          Matrix<T> lam = to_matrix<T>(log_decay, w, "log_decay"), b = to_matrix<T>(B, w, "B"), c = to_matrix<T>(C, w, "C");
          if (bonus) return wrap(erase(semiseparable(std::move(lam), std::move(b), std::move(c), to_matrix<T>(*bonus, w, "bonus", true), o)));
          return wrap(erase(semiseparable(std::move(lam), std::move(b), std::move(c), o)));
        });
      },
      nb::arg("log_decay"), nb::arg("B"), nb::arg("C"), nb::kw_only(), nb::arg("heads"), nb::arg("head_dim") = 1, nb::arg("groups") = 1,
      nb::arg("bonus") = nb::none(), nb::arg("allow_growth") = false,
      "The scan h_t = exp(log_decay_t) h_{t-1} + B_t x_t, y_t = C_t . h_t per head: H[t, s] = C_t . exp(sum log_decay) B_s.\n"
      "log_decay (L, heads*N) per state or (L, heads) per head, <= 0; B, C (L, groups*N); D = heads*head_dim.\n"
      "bonus (heads*N or (1, heads*N)): the strict form with bonus on the diagonal (RWKV's u).");
  m.def(
      "semiseparable_factored",
      [](const array_in& dt, const array_in& A, const array_in& B, const array_in& C, Index heads, Index head_dim, Index groups) {
        const char* w = "semiseparable_factored";
        return by_dtype(dt, w, "dt", [&](auto tag) {
          using T = decltype(tag);
          semiseparable_options o{.heads = heads, .head_dim = head_dim, .groups = groups};
          return wrap(erase(semiseparable(factored_decay(to_matrix<T>(dt, w, "dt"), to_matrix<T>(A, w, "A")), to_matrix<T>(B, w, "B"),
                                          to_matrix<T>(C, w, "C"), o)));
        });
      },
      nb::arg("dt"), nb::arg("A"), nb::arg("B"), nb::arg("C"), nb::kw_only(), nb::arg("heads"), nb::arg("head_dim") = 1, nb::arg("groups") = 1,
      "The Mamba form of semiseparable: log-decay dt (L, heads) (x) A (heads, N), never formed (dt >= 0, A <= 0).");
  m.def(
      "group_norm",
      [](Index groups, std::optional<array_in> weight, double eps, bool centered, const std::string& dt) {
        group_norm_options o{.eps = eps, .centered = centered};
        if (weight)
          return by_dtype(*weight, "group_norm", "weight", [&](auto tag) {
            using T = decltype(tag);
            return wrap(erase(group_norm(groups, to_matrix<T>(*weight, "group_norm", "weight", true), o)));
          });
        if (dt == "float32") return wrap(erase(group_norm<float>(groups, o)));
        if (dt == "float64") return wrap(erase(group_norm<double>(groups, o)));
        throw nb::type_error(("group_norm: dtype must be 'float32' or 'float64', got '" + dt + "'").c_str());
      },
      nb::arg("groups"), nb::arg("weight") = nb::none(), nb::kw_only(), nb::arg("eps") = 1e-5, nb::arg("centered") = false,
      nb::arg("dtype") = "float64",
      "Group norm over `groups` groups of channels, weight (D,) or none: its statistics depend on its input, so it\n"
      "is unbound until bind(x); apply computes them. centered=False: RMS norm (Mamba-2), True: group/layer norm.");
  m.def("flip", [](const Operator& a) { return a.visit([](const auto& A) { return wrap(erase(flip(A))); }); }, nb::arg("op"),
        "J H J: the anti-causal mirror.");
  m.def("row_normalize", [](const Operator& a) { return a.visit([](const auto& A) { return wrap(erase(row_normalize(A))); }); },
        nb::arg("op"), "Each row of H^c divided by its sum.");

  auto dec = nb::class_<Decomposition>(
      m, "Decomposition",
      "A block's exact decomposition on one sequence: output() == out_proj(H x + beta) equals the block's own forward.\n"
      "x (L, D) is the inner input, H the implicit attention over the D inner channels, beta (L, D) every\n"
      "input-independent term, out_weight (d_model, D) and out_bias the output projection (empty: none).");
  dec.def(
         "__init__",
         [](Decomposition* self, const Operator& H, const array_in& x, std::optional<array_in> beta, std::optional<array_in> out_weight,
            std::optional<array_in> out_bias) {
           H.visit([&](const auto& op) {
             using T = typename std::remove_cvref_t<decltype(op)>::scalar;
             const char* w = "Decomposition";
             Matrix<T> X = to_matrix<T>(x, w, "x");
             const Index L = X.rows(), D = X.cols();
             using std::to_string;
             const std::string LD = "(L=" + to_string(L) + ", D=" + to_string(D) + ")";
             if ((op.length() != any && op.length() != L) || (op.channels() != any && op.channels() != D))
               detail::fail(w, "x has shape " + detail::shape_string(L, D) + " but H is an operator of length " +
                                   (op.length() == any ? std::string("any") : to_string(op.length())) + " over " +
                                   (op.channels() == any ? std::string("any number of") : to_string(op.channels())) +
                                   " channels; expected x of shape (H.length, H.channels)");
             Matrix<T> B = beta ? to_matrix<T>(*beta, w, "beta") : Matrix<T>(Matrix<T>::Zero(L, D));
             detail::require_shape(B.rows() == L && B.cols() == D, w, "beta", B.rows(), B.cols(), LD + ", x's shape");
             Matrix<T> W = out_weight ? to_matrix<T>(*out_weight, w, "out_weight") : Matrix<T>();
             if (out_weight) detail::require_shape(W.cols() == D && W.rows() >= 1, w, "out_weight", W.rows(), W.cols(), "(d_out, D=" + to_string(D) + ")");
             Matrix<T> b = out_bias ? to_matrix<T>(*out_bias, w, "out_bias", true) : Matrix<T>();
             if (out_bias) {
               if (!out_weight) detail::fail(w, "out_bias is given without out_weight; an output bias needs the output projection");
               detail::require_shape(b.rows() == 1 && b.cols() == W.rows(), w, "out_bias", b.rows(), b.cols(),
                                     "(d_out=" + to_string(W.rows()) + ",) or (1, d_out)");
             }
             new (self) Decomposition{Operator{op}, models::decomposition<T, AnyOperator<T>>{std::move(X), op, std::move(B), std::move(W), std::move(b)}};
           });
         },
         nb::arg("H"), nb::arg("x"), nb::arg("beta") = nb::none(), nb::arg("out_weight") = nb::none(), nb::arg("out_bias") = nb::none(),
         "A decomposition assembled from its parts: H (an iattn.Operator over D channels), the inner input x (L, D), beta\n"
         "(L, D; default zeros), and optionally the output projection out_weight (d_out, D) and out_bias (d_out,).\n"
         "output() is then out_proj(H x + beta): how an architecture written in Python (e.g. iattn.hf's xLSTM adapter)\n"
         "hands its exact decomposition to the evaluation, explain and iattn.hf like the bound models'.")
      .def_prop_ro("H", [](const Decomposition& d) { return d.H; }, "The implicit attention, an iattn.Operator.")
      .def_prop_ro("dtype", [](const Decomposition& d) { return std::string(dtype_name(d.H.type())); })
      .def_prop_ro("x", [](nb::handle self) {
            return std::visit([&](const auto& e) { return view(self, e.x); }, nb::cast<const Decomposition&>(self).d);
          }, "The inner input (L, D), read-only, no copy.")
      .def_prop_ro("beta", [](nb::handle self) {
            return std::visit([&](const auto& e) { return view(self, e.beta); }, nb::cast<const Decomposition&>(self).d);
          }, "The input-independent term (L, D), read-only.")
      .def_prop_ro("out_weight", [](nb::handle self) {
            return std::visit([&](const auto& e) { return view(self, e.out_weight); }, nb::cast<const Decomposition&>(self).d);
          }, "The output projection's weight (d_model, D), or (0, 0).")
      .def_prop_ro("out_bias", [](nb::handle self) {
            return std::visit([&](const auto& e) { return view(self, e.out_bias); }, nb::cast<const Decomposition&>(self).d);
          }, "The output projection's bias (1, d_model), or (0, 0).")
      .def("output", [](const Decomposition& d) {
            return std::visit([&](const auto& e) -> nb::object {
              using T = typename std::remove_cvref_t<decltype(e)>::scalar_type;
              std::optional<Matrix<T>> y;
              {
                nb::gil_scoped_release release;
                y.emplace(e.output());
              }
              return to_numpy<T>(std::move(*y));
            }, d.d);
          }, "out_proj(H x + beta), (L, d_model): the block's output rebuilt from the decomposition.")
      .def("__repr__", [](const Decomposition& d) { return "iattn.Decomposition(H=" + describe(d.H) + ")"; });
  def_evaluation(dec, [](nb::handle self) -> const Operator& { return nb::cast<const Decomposition&>(self).H; });
}

}  // namespace iattn::py
