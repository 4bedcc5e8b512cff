// The main demo: every model in the zoo, with seeded random weights of realistic shape and one fixed
// sample input. Prints a table (model, L, exactness against the model's own forward, apply and
// materialize times) and writes a gallery into the output directory: per model one channel's
// matrix (signed, blue-white-red), the channel mean (linear with the diagonal masked, and log10),
// the mean of |H^c|, and the rollout map of a 4-layer stack, as titled PNG heatmaps with colorbars
// (.npy files of the mean and rollout), with index.html showing them all, each with a caption.
//
//   iattn_demo [out_dir=out] [--quick]        (--quick: small shapes, for the smoke test)
//   iattn_demo --survey L d_model              every model at that size: one call each of init,
//                                              forward, decompose, apply, materialize and the
//                                              channel mean, timed (what a user's first session
//                                              costs); no pictures
#include <iattn/explain/methods.hpp>
#include <iattn/explain/npy.hpp>
#include <iattn/explain/png.hpp>
#include <iattn/models/all.hpp>
#include <iattn/models/stack.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

using namespace iattn;
using namespace iattn::models;
using Mat = Matrix<float>;

namespace {

struct settings {
  Index L = 512, d = 256, layers = 4, view = 64;
  std::string out = "out";
  bool survey = false;  // --survey L d: one call of each step per model, timed; no pictures
};

struct row_result {
  std::string name, note;
  Index L = 0, D = 0;
  double err = 0, apply_ms = 0, materialize_ms = 0;
  std::vector<std::pair<std::string, std::string>> figures = {};  // (PNG file name, caption)
  double init_ms = 0, forward_ms = 0, decompose_ms = 0, mean_ms = 0;  // --survey
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

template <class F>
double best_ms(F&& f, int reps = 3) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

/// One model: exactness and timings on the sample input, the heatmaps, and a stack's rollout.
template <class MakeBlock, class Forward, class Decompose>
row_result run_model(const settings& st, const std::string& name, const std::string& note, const Mat& u, MakeBlock make_block,
                     Forward forward, Decompose decompose) {
  row_result r{name, note, u.rows(), 0, 0, 0, 0};
  auto t0 = std::chrono::steady_clock::now();
  const auto w = make_block(Index(0));
  r.init_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  const Mat block = forward(w, u);
  r.forward_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  const auto d = decompose(w, u);
  r.decompose_ms = ms_since(t0);
  r.D = d.x.cols();
  r.err = double((d.output() - block).cwiseAbs().maxCoeff()) / (1.0 + double(block.cwiseAbs().maxCoeff()));
  const int reps = st.survey ? 1 : 3;
  r.apply_ms = best_ms([&] { volatile float sink = apply(d.H, d.x)(0, 0); (void)sink; }, reps);
  r.materialize_ms = best_ms([&] { volatile float sink = materialize(d.H, 0, u.rows())(0, 0); (void)sink; }, reps);
  if (st.survey) {  // every step of a user's first session with the model, at the asked size
    r.mean_ms = best_ms([&] { volatile float sink = materialize_mean(d.H, u.rows())(0, 0); (void)sink; }, 1);
    return r;
  }

  // the pictures: the first st.view tokens, so that single entries stay visible
  const Mat us = u.topRows(std::min(u.rows(), st.view));
  const auto dv = decompose(w, us);
  const std::string base = st.out + "/" + name;
  const Index c = r.D / 3;  // one channel away from the edges
  const Mat one = materialize(dv.H, c, us.rows());
  const Mat mean = materialize_mean(dv.H, us.rows());
  // each picture: a two-line title in the image (what, then how it is displayed), the same words as
  // its caption in index.html
  auto picture = [&](const std::string& kind, const Mat& M, const explain::map_subject& what, explain::heatmap_options o) {
    o.cell = 6;
    o.title = explain::heatmap_caption(what, M, o, "\n");
    explain::write_heatmap_png(base + "_" + kind + ".png", M, o);
    r.figures.emplace_back(name + "_" + kind + ".png", explain::heatmap_caption(what, M, o));
  };
  picture("channel", one, {.model = name, .channel = c}, {.colormap = explain::colormap_kind::diverging});  // signed, white at 0
  picture("mean", mean, {.model = name, .channels = r.D}, {.mask_diagonal = true});
  picture("mean_log", mean, {.model = name, .channels = r.D}, {.scale = explain::scale_kind::log});
  npy::write(base + "_mean.npy", mean);
  // the mean of |H^c|, which no cancellation between channels of opposite sign can hide (against |mean H^c| above)
  const Mat abs_mean = materialize_mean(dv.H, {.abs = true}, us.rows());
  picture("abs_mean", abs_mean, {.model = name, .channels = r.D, .abs_mean = true}, {.mask_diagonal = true});

  // a stack of st.layers blocks of this model, its per-layer channel means, and their rollout
  const auto s = make_stack<float>(st.layers, 64, u.cols(), make_block, 5);
  const auto run = run_stack(s, us, decompose);
  std::vector<Mat> maps;
  for (const auto& layer : run.layers) maps.push_back(materialize_mean(layer.H, us.rows()).cwiseAbs());
  const Mat rho = explain::rollout(maps);
  picture("rollout", rho, {.model = name, .what = "rollout over " + std::to_string(st.layers) + " layers of |channel mean|"},
          {.mask_diagonal = true});
  npy::write(base + "_rollout.npy", rho);
  return r;
}

std::string index_html(const std::vector<row_result>& rows, const settings& st) {
  std::string h =
      "<!doctype html><html><head><meta charset=\"utf-8\"><title>iattn gallery</title><style>"
      "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:4px 10px;border-bottom:1px solid #ccc}"
      "figure{display:inline-block;vertical-align:top;margin:6px;max-width:480px}figcaption{font-size:90%}"
      "img{max-width:100%;image-rendering:pixelated}"
      "</style></head><body><h1>iattn: implicit attention of every model in the zoo</h1>"
      "<p>Seeded random weights, one sample input. The table is at L = " + std::to_string(st.L) + "; the heatmaps show the first " +
      std::to_string(std::min(st.L, st.view)) + " tokens, row t (query) against column s (key); each caption says what the map is and how it is displayed "
      "(viridis for magnitudes, blue-white-red for signed maps, grey for a masked diagonal). Rollout over a " + std::to_string(st.layers) + "-layer pre-norm stack of the same block.</p>"
      "<table><tr><th>model</th><th>D</th><th>max |block - out_proj(Hx+&beta;)| (rel.)</th><th>apply ms</th><th>materialize ms</th></tr>";
  char buf[256];
  for (const auto& r : rows) {
    std::snprintf(buf, sizeof buf, "<tr><td>%s</td><td>%lld</td><td>%.1e</td><td>%.2f</td><td>%.2f</td></tr>", r.name.c_str(),
                  static_cast<long long>(r.D), r.err, r.apply_ms, r.materialize_ms);
    h += buf;
  }
  h += "</table>";
  for (const auto& r : rows) {
    h += "<h2>" + r.name + "</h2><p>" + r.note + "</p>";
    for (const auto& [file, caption] : r.figures)
      h += "<figure><img src=\"" + file + "\" alt=\"" + caption + "\"><figcaption>" + caption + "</figcaption></figure>";  // our words: no markup
  }
  return h + "</body></html>\n";
}

}  // namespace

int main(int argc, char** argv) {
  settings st;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      st.L = 32;
      st.d = 32;
      st.layers = 2;
    } else if (a == "--survey") {
      // the models split d_model into 4 heads and keys of d/8: multiples of 32
      char* end1 = nullptr;
      char* end2 = nullptr;
      const long Lv = i + 2 < argc ? std::strtol(argv[i + 1], &end1, 10) : 0;
      const long dv = i + 2 < argc ? std::strtol(argv[i + 2], &end2, 10) : 0;
      if (i + 2 >= argc || *end1 != '\0' || *end2 != '\0' || Lv < 1 || dv < 32 || dv % 32 != 0) {
        std::fprintf(stderr, "iattn_demo: --survey takes L >= 1 and d_model, a multiple of 32 (got %s %s)\n",
                     i + 1 < argc ? argv[i + 1] : "nothing", i + 2 < argc ? argv[i + 2] : "");
        return 2;
      }
      st.survey = true;
      st.L = Lv;
      st.d = dv;
      i += 2;
    } else {
      st.out = a;
    }
  }
  if (!st.survey) std::filesystem::create_directories(st.out);
  const Index L = st.L, d = st.d;
  const Mat u = sample_input<float>(L, d, 7);
  std::vector<row_result> rows;
  auto add = [&](row_result r) {
    std::printf("%-18s %5lld %6lld   %8.1e   %9.2f   %9.2f", r.name.c_str(), static_cast<long long>(r.L), static_cast<long long>(r.D), r.err,
                r.apply_ms, r.materialize_ms);
    if (st.survey) std::printf("   %9.1f %9.1f %9.1f %9.1f", r.init_ms, r.forward_ms, r.decompose_ms, r.mean_ms);
    std::printf("\n");
    std::fflush(stdout);
    rows.push_back(std::move(r));
  };
  std::printf("%-18s %5s %6s   %8s   %9s   %9s", "model", "L", "D", "rel.err", "apply ms", "mater. ms");
  if (st.survey) std::printf("   %9s %9s %9s %9s", "init ms", "fwd ms", "decomp ms", "mean ms");
  std::printf("\n");

  add(run_model(st, "mamba", "Mamba-1 block, exact (D skip and conv bias kept)", u,
                [&](Index l) { return mamba_init<float>({.d_model = d, .d_state = 16}, 100 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return mamba_forward(w, x); }, [](const auto& w, const Mat& x) { return mamba_decompose(w, x); }));
  add(run_model(st, "mamba2", "Mamba-2 block: multi-head SSD, gated group RMSNorm", u,
                [&](Index l) { return mamba2_init<float>({.d_model = d, .d_state = 64, .headdim = 32}, 200 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return mamba2_forward(w, x); }, [](const auto& w, const Mat& x) { return mamba2_decompose(w, x); }));
  add(run_model(st, "griffin", "Griffin/Hawk recurrent block (RG-LRU, sqrt(1-a^2) kept)", u,
                [&](Index l) { return griffin_init<float>({.width = d, .lru_width = d, .num_heads = 4}, 300 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return griffin_forward(w, x); }, [](const auto& w, const Mat& x) { return griffin_decompose(w, x); }));
  add(run_model(st, "rwkv4", "RWKV-4 time mixing (WKV row-normalised, strict with bonus)", u,
                [&](Index l) { return rwkv4_init<float>({.hidden_size = d, .attention_hidden_size = d, .layer_id = l, .num_hidden_layers = st.layers}, 400 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return rwkv4_forward(w, x); }, [](const auto& w, const Mat& x) { return rwkv4_decompose(w, x); }));
  add(run_model(st, "retnet", "RetNet multi-scale retention (gamma_h = 1 - 2^(-5-h))", u,
                [&](Index l) { return retnet_init<float>({.embed_dim = d, .value_dim = 2 * d, .num_heads = 4}, 500 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return retnet_forward(w, x); }, [](const auto& w, const Mat& x) { return retnet_decompose(w, x); }));
  add(run_model(st, "hgrn", "HGRN (forget-gate lower bound grows with depth)", u,
                [&](Index l) { return hgrn_init<float>({.hidden_size = d, .layer_idx = l, .num_layers = st.layers}, 600 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return hgrn_forward(w, x); }, [](const auto& w, const Mat& x) { return hgrn_decompose(w, x); }));
  add(run_model(st, "gla", "Gated linear attention (fla)", u,
                [&](Index l) { return gla_init<float>({.hidden_size = d, .key_dim = d / 2, .value_dim = d, .num_heads = 4}, 700 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return gla_forward(w, x); }, [](const auto& w, const Mat& x) { return gla_decompose(w, x); }));
  add(run_model(st, "hgrn2", "HGRN2: HGRN with state expansion (fla)", u,
                [&](Index l) { return hgrn2_init<float>({.hidden_size = d, .expand_ratio = d / 4, .layer_idx = l, .num_layers = st.layers}, 800 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return hgrn2_forward(w, x); }, [](const auto& w, const Mat& x) { return hgrn2_decompose(w, x); }));
  add(run_model(st, "rwkv6", "RWKV-6 (data-dependent shift and decay, bonus, group norm)", u,
                [&](Index l) {
                  return rwkv6_init<float>({.hidden_size = d, .key_dim = d / 2, .value_dim = d, .num_heads = 2, .proj_low_rank_dim = 8,
                                            .gate_low_rank_dim = 16, .layer_idx = l, .num_layers = st.layers}, 900 + std::uint64_t(l));
                },
                [](const auto& w, const Mat& x) { return rwkv6_forward(w, x); }, [](const auto& w, const Mat& x) { return rwkv6_decompose(w, x); }));
  add(run_model(st, "linear_attention", "Normalised linear attention, phi = elu + 1", u,
                [&](Index l) { return linear_attention_init<float>({.d_model = d, .n_heads = 4, .d_keys = d / 4, .d_values = d / 4}, 1000 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return linear_attention_forward(w, x); },
                [](const auto& w, const Mat& x) { return linear_attention_decompose(w, x); }));
  add(run_model(st, "softmax_attention", "Causal softmax attention (a Transformer layer, for comparison)", u,
                [&](Index l) { return transformer_init<float>({.embed_dim = d, .num_heads = 4}, 1100 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return transformer_forward(w, x); }, [](const auto& w, const Mat& x) { return transformer_decompose(w, x); }));
  add(run_model(st, "s4d", "S4D: an LTI kernel as one long convolution, GELU as a diagonal", u,
                [&](Index l) { return s4d_init<float>({.d_model = d, .d_state = 64}, 1200 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return s4d_forward(w, x); }, [](const auto& w, const Mat& x) { return s4d_decompose(w, x); }));
  add(run_model(st, "hyena", "Hyena of order 2: gates around a long implicit filter", u,
                [&](Index l) { return hyena_init<float>({.d_model = d, .l_max = L}, 1300 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return hyena_forward(w, x); }, [](const auto& w, const Mat& x) { return hyena_decompose(w, x); }));
  add(run_model(st, "vision_mamba", "Vision Mamba: forward plus flipped backward scan (not causal)", u,
                [&](Index l) { return vision_mamba_init<float>({.mamba = {.d_model = d, .d_state = 16}}, 1400 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return vision_mamba_forward(w, x); },
                [](const auto& w, const Mat& x) { return vision_mamba_decompose(w, x); }));
  add(run_model(st, "mlstm", "xLSTM mLSTM layer (stabilised matrix memory)", u,
                [&](Index l) { return mlstm_init<float>({.embedding_dim = d}, 1500 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return mlstm_forward(w, x); }, [](const auto& w, const Mat& x) { return mlstm_decompose(w, x); }));
  add(run_model(st, "qwen3_next", "Qwen3-Next Gated DeltaNet (delta rule: decay and key removal)", u,
                [&](Index l) {
                  return qwen3_next_init<float>({.hidden_size = d, .linear_num_value_heads = 4, .linear_num_key_heads = 2,
                                                 .linear_key_head_dim = d / 8, .linear_value_head_dim = d / 4}, 1600 + std::uint64_t(l));
                },
                [](const auto& w, const Mat& x) { return qwen3_next_forward(w, x); }, [](const auto& w, const Mat& x) { return qwen3_next_decompose(w, x); }));
  add(run_model(st, "deltanet", "DeltaNet (fla): the ungated delta rule", u,
                [&](Index l) {
                  return deltanet_init<float>({.hidden_size = d, .head_dim = d / 4, .expand_v = 1, .num_heads = 4, .gated = false, .use_gate = false},
                                              1700 + std::uint64_t(l));
                },
                [](const auto& w, const Mat& x) { return deltanet_forward(w, x); }, [](const auto& w, const Mat& x) { return deltanet_decompose(w, x); }));
  add(run_model(st, "kimi_delta", "Kimi Delta Attention: per-key gate, then key removal", u,
                [&](Index l) { return kimi_linear_init<float>({.hidden_size = d, .linear_num_heads = 4, .linear_head_dim = d / 4}, 1800 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return kimi_linear_forward(w, x); }, [](const auto& w, const Mat& x) { return kimi_linear_decompose(w, x); }));
  add(run_model(st, "deltaproduct", "Gated DeltaProduct: two Householder steps per token", u,
                [&](Index l) {
                  return deltaproduct_init<float>({.hidden_size = d, .head_dim = d / 8, .num_heads = 4, .num_householder = 2}, 2000 + std::uint64_t(l));
                },
                [](const auto& w, const Mat& x) { return deltaproduct_forward(w, x); },
                [](const auto& w, const Mat& x) { return deltaproduct_decompose(w, x); }));
  add(run_model(st, "mamba3", "Mamba-3 SISO: trapezoidal rule, data-dependent rotations (complex decay)", u,
                [&](Index l) { return mamba3_init<float>({.d_model = d, .d_state = 32, .headdim = 32}, 2100 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return mamba3_forward(w, x); }, [](const auto& w, const Mat& x) { return mamba3_decompose(w, x); }));
  add(run_model(st, "lru", "Linear Recurrent Unit: complex diagonal states mixed by B and C", u,
                [&](Index l) { return lru_init<float>({.d_model = d, .d_hidden = 32, .r_min = 0.5, .r_max = 0.99, .max_phase = 0.314}, 2200 + std::uint64_t(l)); },
                [](const auto& w, const Mat& x) { return lru_forward(w, x); }, [](const auto& w, const Mat& x) { return lru_decompose(w, x); }));
  add(run_model(st, "rwkv7", "RWKV-7 time mixing: diagonal plus rank-one transition, bonus, group norm", u,
                [&](Index l) {
                  // every layer as a first layer (no value residual); o_proj drawn (the reference init zeroes it)
                  auto w = rwkv7_init<float>({.hidden_size = d, .head_dim = std::min<Index>(64, d / 4), .decay_low_rank_dim = 16, .a_low_rank_dim = 16,
                                              .v_low_rank_dim = 16, .gate_low_rank_dim = 32, .num_hidden_layers = st.layers}, 1900 + std::uint64_t(l));
                  init::generator g(1950 + std::uint64_t(l));
                  w.o_proj_weight = init::normal<float>(g, d, d, 1.0 / std::sqrt(double(d)));
                  return w;
                },
                [](const auto& w, const Mat& x) { return rwkv7_forward(w, x); }, [](const auto& w, const Mat& x) { return rwkv7_decompose(w, x); }));

  if (!st.survey) {
    explain::write_text(st.out + "/index.html", index_html(rows, st));
    std::printf("gallery: %s/index.html (%zu models)\n", st.out.c_str(), rows.size());
  }
  double worst = 0;
  for (const auto& r : rows) worst = std::max(worst, r.err);
  std::printf("worst relative exactness error (float): %.1e\n", worst);
  return worst < 1e-4 ? 0 : 1;
}
