// ggml-kernel-cases: run MUL_MAT cases on every non-CPU backend and compare with the CPU backend.
//
// Built by `pairctl build` against the package's own ggml (same static libraries and headers as
// its ggml-rpc-server), so the check exercises exactly the kernels that get deployed. Each case is
// computed once on the CPU backend (the reference) and once on every non-CPU device: local GPUs
// and the RPC devices of every `--rpc HOST:PORT`. The comparison is test-backend-ops' normalised
// mean squared error; each case is then timed for `runs` graph computations so the same cases
// serve as a micro-benchmark.
//
// Usage:
//   ggml-kernel-cases --case name=w4,type=bf16,k=320,m=10240,n=4[,k_stride=384][,wch=2,ch=4][,runs=20][,seed=1]
//                     [--case ...] [--rpc HOST:PORT ...] [--no-local] [--max-nmse 5e-4] [--perturb NAME|all]
//                     [--list-devices]
// Output: one JSON object per line per (case, backend), then one summary line.
// Exit: 0 all passed, 1 a comparison failed, 2 usage or setup error, 3 no non-CPU backend to test.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-rpc.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct test_case {
    std::string name;
    ggml_type   type     = GGML_TYPE_BF16;
    int64_t     k        = 0;
    int64_t     m        = 0;
    int64_t     n        = 1;
    int64_t     k_stride = 0;  // 0: contiguous; > k: the weights are a view with this stored row length
    int64_t     wch      = 1;  // weight channels
    int64_t     ch       = 1;  // activation / destination channels (a multiple of wch: broadcast)
    int         runs     = 20;
    uint32_t    seed     = 1;
};

[[noreturn]] void usage_error(const std::string & msg) {
    std::fprintf(stderr, "ggml-kernel-cases: %s\n", msg.c_str());
    std::exit(2);
}

ggml_type parse_type(const std::string & s) {
    if (s == "bf16") return GGML_TYPE_BF16;
    if (s == "f16")  return GGML_TYPE_F16;
    if (s == "f32")  return GGML_TYPE_F32;
    usage_error("unknown weight type '" + s + "' (bf16, f16, f32)");
}

int64_t parse_int(const std::string & key, const std::string & v) {
    char * end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || x < 0) {
        usage_error("case field " + key + "=" + v + " is not a non-negative integer");
    }
    return x;
}

test_case parse_case(const std::string & spec) {
    test_case c;
    std::stringstream ss(spec);
    std::string item;
    while (std::getline(ss, item, ',')) {
        const size_t eq = item.find('=');
        if (eq == std::string::npos) usage_error("case field '" + item + "' is not key=value");
        const std::string key = item.substr(0, eq);
        const std::string val = item.substr(eq + 1);
        if      (key == "name")     c.name     = val;
        else if (key == "type")     c.type     = parse_type(val);
        else if (key == "k")        c.k        = parse_int(key, val);
        else if (key == "m")        c.m        = parse_int(key, val);
        else if (key == "n")        c.n        = parse_int(key, val);
        else if (key == "k_stride") c.k_stride = parse_int(key, val);
        else if (key == "wch")      c.wch      = parse_int(key, val);
        else if (key == "ch")       c.ch       = parse_int(key, val);
        else if (key == "runs")     c.runs     = (int) parse_int(key, val);
        else if (key == "seed")     c.seed     = (uint32_t) parse_int(key, val);
        else usage_error("unknown case field '" + key + "'");
    }
    if (c.name.empty() || c.k <= 0 || c.m <= 0 || c.n <= 0 || c.wch <= 0 || c.ch <= 0 || c.runs <= 0) {
        usage_error("case '" + spec + "' needs name, k, m, n > 0");
    }
    if (c.k_stride != 0 && c.k_stride <= c.k) usage_error("case " + c.name + ": k_stride must be larger than k");
    if (c.ch % c.wch != 0) usage_error("case " + c.name + ": ch must be a multiple of wch");
    return c;
}

std::string json_escape(const std::string & s) {
    std::string out;
    for (char ch : s) {
        switch (ch) {
            case '"':  out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n";  break;
            default:
                if ((unsigned char) ch < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof(buf), "\\u%04x", ch);
                    out += buf;
                } else {
                    out += ch;
                }
        }
    }
    return out;
}

std::string json_num(double x) {
    if (!std::isfinite(x)) return "null";  // JSON has no NaN/Inf; null never passes
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.9g", x);
    return buf;
}

// Host copies of the inputs, made once per case so every backend sees the same bytes.
struct case_data {
    std::vector<uint8_t> a;  // weights, stored layout [k_phys, m, wch]
    std::vector<float>   b;  // activations [k, n, ch]
};

case_data make_data(const test_case & c) {
    const int64_t k_phys = c.k_stride ? c.k_stride : c.k;
    const int64_t na = k_phys * c.m * c.wch;
    std::mt19937 rng(c.seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);

    std::vector<float> af(na);
    for (int64_t i = 0; i < na; ++i) {
        // Padding beyond k holds NaN: a kernel that reads it poisons its result and fails.
        af[i] = (i % k_phys) < c.k ? dist(rng) : std::numeric_limits<float>::quiet_NaN();
    }
    case_data d;
    d.a.resize(na * ggml_type_size(c.type));
    switch (c.type) {
        case GGML_TYPE_BF16: ggml_fp32_to_bf16_row(af.data(), (ggml_bf16_t *) d.a.data(), na); break;
        case GGML_TYPE_F16:  ggml_fp32_to_fp16_row(af.data(), (ggml_fp16_t *) d.a.data(), na); break;
        default:             std::memcpy(d.a.data(), af.data(), na * sizeof(float)); break;
    }
    d.b.resize(c.k * c.n * c.ch);
    for (float & x : d.b) x = dist(rng);
    return d;
}

struct run_result {
    bool                ok = false;
    std::string         error;
    std::vector<float>  out;
    double              us_per_run = 0.0;
};

// Build [weights view] x [activations] on `backend`, upload, compute once, read back, then time.
run_result run_case(ggml_backend_t backend, ggml_backend_dev_t dev, const test_case & c, const case_data & d) {
    run_result r;
    ggml_init_params params = {
        /* .mem_size   = */ 16 * ggml_tensor_overhead() + ggml_graph_overhead(),
        /* .mem_buffer = */ nullptr,
        /* .no_alloc   = */ true,
    };
    ggml_context * ctx = ggml_init(params);
    const int64_t k_phys = c.k_stride ? c.k_stride : c.k;
    ggml_tensor * a_base = ggml_new_tensor_4d(ctx, c.type, k_phys, c.m, c.wch, 1);
    ggml_tensor * a = a_base;
    if (c.k_stride) {
        a = ggml_view_4d(ctx, a_base, c.k, c.m, c.wch, 1, a_base->nb[1], a_base->nb[2], a_base->nb[3], 0);
    }
    ggml_tensor * b = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.k, c.n, c.ch, 1);
    ggml_tensor * out = ggml_mul_mat(ctx, a, b);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);

    if (dev != nullptr && !ggml_backend_dev_supports_op(dev, out)) {
        r.error = "backend does not support this MUL_MAT";
        ggml_free(ctx);
        return r;
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    if (buf == nullptr) {
        r.error = "could not allocate the case's tensors on the backend";
        ggml_free(ctx);
        return r;
    }
    ggml_backend_tensor_set(a_base, d.a.data(), 0, d.a.size());
    ggml_backend_tensor_set(b, d.b.data(), 0, d.b.size() * sizeof(float));

    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
        r.error = "graph compute failed";
    } else {
        r.out.resize(ggml_nelements(out));
        ggml_backend_tensor_get(out, r.out.data(), 0, ggml_nbytes(out));
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < c.runs; ++i) {
            ggml_backend_graph_compute(backend, gf);
        }
        ggml_backend_synchronize(backend);
        // Read one value back: RPC computes asynchronously, and a read is answered only after the queued
        // computations ran on the server, so the timing covers the work and not just the sending.
        float probe = 0.0f;
        ggml_backend_tensor_get(out, &probe, 0, sizeof(probe));
        const auto t1 = std::chrono::steady_clock::now();
        r.us_per_run = std::chrono::duration<double, std::micro>(t1 - t0).count() / c.runs;
        r.ok = true;
    }
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return r;
}

// test-backend-ops' nmse: sum((a-b)^2) / sum(a^2), a = the backend under test, b = the CPU.
double nmse(const std::vector<float> & a, const std::vector<float> & b) {
    double mse_a_b = 0.0, mse_a_0 = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double ai = a[i], bi = b[i];
        mse_a_b += (ai - bi) * (ai - bi);
        mse_a_0 += ai * ai;
    }
    return mse_a_b / mse_a_0;
}

double max_abs_err(const std::vector<float> & a, const std::vector<float> & b) {
    double m = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double e = std::fabs((double) a[i] - (double) b[i]);
        if (std::isnan(e)) return std::numeric_limits<double>::quiet_NaN();
        m = std::max(m, e);
    }
    return m;
}

struct target {
    ggml_backend_dev_t dev;
    std::string        name;
    std::string        description;
};

}  // namespace

int main(int argc, char ** argv) {
    std::vector<test_case>   cases;
    std::vector<std::string> rpc_endpoints;
    std::vector<std::string> perturb;
    double max_nmse = 5e-4;
    bool   local = true;
    bool   list_only = false;

    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage_error(arg + " needs a value");
            return argv[++i];
        };
        if      (arg == "--case")         cases.push_back(parse_case(value()));
        else if (arg == "--rpc")          rpc_endpoints.push_back(value());
        else if (arg == "--perturb")      perturb.push_back(value());
        else if (arg == "--max-nmse")     max_nmse = std::atof(value().c_str());
        else if (arg == "--no-local")     local = false;
        else if (arg == "--list-devices") list_only = true;
        else if (arg == "-h" || arg == "--help") {
            std::printf("usage: %s --case name=...,type=bf16,k=..,m=..,n=..[,k_stride=..][,wch=..,ch=..][,runs=..][,seed=..] "
                        "[--rpc HOST:PORT] [--no-local] [--max-nmse X] [--perturb NAME|all] [--list-devices]\n", argv[0]);
            return 0;
        } else {
            usage_error("unknown argument '" + arg + "'");
        }
    }
    for (const auto & p : perturb) {
        const bool known = p == "all" || std::any_of(cases.begin(), cases.end(), [&](const test_case & c) { return c.name == p; });
        if (!known) usage_error("--perturb names no case: '" + p + "'");
    }
    if (!(max_nmse > 0.0)) usage_error("--max-nmse must be positive");

    ggml_log_set([](ggml_log_level level, const char * text, void *) {
        if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
    }, nullptr);

    std::vector<target> targets;
    if (local) {
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            ggml_backend_dev_t dev = ggml_backend_dev_get(i);
            // GPUs only: ACCEL devices (BLAS, AMX) extend the CPU, META wraps other devices.
            const enum ggml_backend_dev_type type = ggml_backend_dev_type(dev);
            if (type != GGML_BACKEND_DEVICE_TYPE_GPU && type != GGML_BACKEND_DEVICE_TYPE_IGPU) continue;
            targets.push_back({dev, ggml_backend_dev_name(dev), ggml_backend_dev_description(dev)});
        }
    }
    for (const auto & ep : rpc_endpoints) {
        ggml_backend_reg_t reg = ggml_backend_rpc_add_server(ep.c_str());
        if (reg == nullptr) {
            std::fprintf(stderr, "ggml-kernel-cases: RPC server %s has no devices or cannot be reached\n", ep.c_str());
            return 2;
        }
        for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
            ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, i);
            targets.push_back({dev, std::string(ggml_backend_dev_name(dev)) + "[" + ep + "]", ggml_backend_dev_description(dev)});
        }
    }
    if (list_only) {
        for (const auto & t : targets) {
            std::printf("{\"device\":\"%s\",\"description\":\"%s\"}\n", json_escape(t.name).c_str(), json_escape(t.description).c_str());
        }
        return 0;
    }
    if (cases.empty()) usage_error("no --case given");
    if (targets.empty()) {
        std::printf("{\"summary\":true,\"error\":\"no non-CPU backend to test\",\"passed\":0,\"failed\":0}\n");
        return 3;
    }

    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    if (cpu == nullptr) {
        std::fprintf(stderr, "ggml-kernel-cases: no CPU backend\n");
        return 2;
    }

    int n_pass = 0, n_fail = 0;
    for (const auto & c : cases) {
        const case_data d = make_data(c);
        run_result ref = run_case(cpu, nullptr, c, d);
        if (!ref.ok) {
            std::fprintf(stderr, "ggml-kernel-cases: CPU reference failed for %s: %s\n", c.name.c_str(), ref.error.c_str());
            return 2;
        }
        const bool perturbed = std::any_of(perturb.begin(), perturb.end(), [&](const std::string & p) { return p == "all" || p == c.name; });
        if (perturbed) {
            // On purpose: scale the reference by 1.05, an nmse of ~2.5e-3 that must fail at 5e-4.
            for (float & x : ref.out) x *= 1.05f;
        }
        for (const auto & t : targets) {
            ggml_backend_t backend = ggml_backend_dev_init(t.dev, nullptr);
            run_result r;
            if (backend == nullptr) {
                r.error = "could not initialise the backend";
            } else {
                r = run_case(backend, t.dev, c, d);
                ggml_backend_free(backend);
            }
            double err = std::numeric_limits<double>::quiet_NaN();
            double maxe = std::numeric_limits<double>::quiet_NaN();
            if (r.ok) {
                err  = nmse(r.out, ref.out);
                maxe = max_abs_err(r.out, ref.out);
            }
            const bool passed = r.ok && std::isfinite(err) && err <= max_nmse;
            passed ? ++n_pass : ++n_fail;
            std::printf(
                "{\"case\":\"%s\",\"backend\":\"%s\",\"device\":\"%s\",\"type\":\"%s\",\"k\":%lld,\"m\":%lld,\"n\":%lld,"
                "\"k_stride\":%lld,\"weight_channels\":%lld,\"channels\":%lld,\"nmse\":%s,\"max_err\":%s,\"max_nmse\":%s,"
                "\"passed\":%s,\"perturbed\":%s,\"us_per_run\":%s,\"cpu_us_per_run\":%s,\"runs\":%d,\"error\":%s}\n",
                json_escape(c.name).c_str(), json_escape(t.name).c_str(), json_escape(t.description).c_str(),
                ggml_type_name(c.type), (long long) c.k, (long long) c.m, (long long) c.n, (long long) c.k_stride,
                (long long) c.wch, (long long) c.ch, json_num(err).c_str(), json_num(maxe).c_str(), json_num(max_nmse).c_str(),
                passed ? "true" : "false", perturbed ? "true" : "false", r.ok ? json_num(r.us_per_run).c_str() : "null",
                json_num(ref.us_per_run).c_str(), c.runs,
                r.error.empty() ? "null" : ("\"" + json_escape(r.error) + "\"").c_str());
            std::fflush(stdout);
        }
    }
    ggml_backend_free(cpu);
    std::printf("{\"summary\":true,\"passed\":%d,\"failed\":%d,\"backends\":%zu,\"cases\":%zu}\n",
                n_pass, n_fail, targets.size(), cases.size());
    return n_fail == 0 ? 0 : 1;
}
