// An op-face target in C++: a contiguous `update_and_fetch` cache (one sequence; per layer a history of
// K/V rows), speaking the conformance protocol's op face itself (spec/PROTOCOL.md, "Op-face targets"):
//
//     g++ -std=c++17 -O1 -I "$(kvcache cpp --include)" -o serve_op_contiguous serve_op_contiguous.cpp
//     kvcache conformance --target cmd:./serve_op_contiguous --strict
//
// It is shaped like upstream's ContiguousReferenceCache (and the MLX runtime's cache behind it): each
// layer is its own history that appends at its used length, `position` is not read, and a ring layer
// keeps every row and applies its window through the mask. So it declares the scope [flat, ring, mla]:
// it leaves out `positions` and `steps` (SPEC.md 8.4), and the suite says so in its verdict.
// Everything the spec refuses is refused before anything changes (OP-ATOMIC), with the rule it breaks.
//
// Only the header's JSON reader and writer are used: the op face has no C++ driver (its tensors are
// the caller's own type: an MLX array, a torch tensor), so a real cache's server converts them here.
// Build with -DKVCACHE_EXAMPLE_WINDOW_OFF_BY_ONE for a broken variant the suite must catch.

#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvcache_conformance.hpp"

using kvcache_conformance::Json;

namespace {

struct Rejected : std::runtime_error {
  Rejected(std::string rule_id, const std::string& what) : std::runtime_error(what), rule(std::move(rule_id)) {}
  std::string rule;
};

// --- tensors on the wire: {"dtype", "shape", "data"}, elements flat in row-major order ----------------

struct Tensor {
  std::string dtype;
  std::vector<long long> shape;
  std::vector<double> data;   // float32 and int64 values alike fit a double exactly here
};

bool is_int(const Json* j) { return j != nullptr && j->is(Json::Type::Int) && !j->big; }

// A malformed tensor is a protocol error: the harness sends only well-formed ones.
Tensor read_tensor(const Json* j, const char* name) {
  Tensor t;
  const Json* dtype = j ? j->get("dtype") : nullptr;
  const Json* shape = j ? j->get("shape") : nullptr;
  const Json* data = j ? j->get("data") : nullptr;
  if (!dtype || !dtype->is(Json::Type::String) || !shape || !shape->is(Json::Type::Array) || !data ||
      !data->is(Json::Type::Array))
    throw std::invalid_argument(std::string(name) + " is not a tensor {dtype, shape, data}");
  t.dtype = dtype->string;
  long long count = 1;
  for (const Json& d : shape->array) {
    if (!is_int(&d) || d.integer < 0) throw std::invalid_argument(std::string(name) + ": a bad shape");
    t.shape.push_back(d.integer);
    count *= d.integer;
  }
  if (static_cast<long long>(data->array.size()) != count)
    throw std::invalid_argument(std::string(name) + ": data does not fill its shape");
  for (const Json& x : data->array) {
    if (x.is(Json::Type::Int)) t.data.push_back(static_cast<double>(x.integer));
    else if (x.is(Json::Type::Double)) t.data.push_back(x.number);
    else throw std::invalid_argument(std::string(name) + ": data holds a non-number");
  }
  return t;
}

Json number(double x) {
  Json j;
  j.type = Json::Type::Double;
  j.number = x;
  return j;
}

Json tensor(const std::string& dtype, const std::vector<long long>& shape, const std::vector<double>& data) {
  Json t = Json::obj(), dims = Json::arr(), values = Json::arr();
  for (long long d : shape) dims.push(Json::of(d));
  for (double x : data) values.push(dtype == "bool" ? Json::of(x != 0) : number(x));
  t.set("dtype", Json::of(dtype));
  t.set("shape", dims);
  t.set("data", values);
  return t;
}

// --- the cache --------------------------------------------------------------------------------------

struct Config {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0, v_head_dim = 0, batch_size = 0, capacity = 0;
  std::vector<int> windows;   // per layer: 0 = flat
};

int size_field(const Json& cfg, const char* name, const Json* fallback = nullptr) {
  const Json* v = cfg.get(name);
  if (!v) v = fallback;
  if (!is_int(v) || v->integer < 1 || v->integer > (1 << 20))
    throw Rejected("OP-CONFIG", std::string(name) + " must be an int >= 1");
  return static_cast<int>(v->integer);
}

Config read_config(const Json& cfg) {
  Config c;
  c.n_layers = size_field(cfg, "n_layers");
  c.n_kv_heads = size_field(cfg, "n_kv_heads");
  c.head_dim = size_field(cfg, "head_dim");
  c.v_head_dim = size_field(cfg, "v_head_dim", cfg.get("head_dim"));
  c.batch_size = size_field(cfg, "batch_size");
  c.capacity = size_field(cfg, "capacity");
  const Json* sizing = cfg.get("sizing");
  if (sizing && !(sizing->is(Json::Type::String) && (sizing->string == "dynamic" || sizing->string == "static")))
    throw Rejected("OP-CONFIG", "sizing is dynamic or static");
  const Json* layers = cfg.get("layers");
  if (!layers || !layers->is(Json::Type::Array) ||
      (layers->array.size() != 1 && layers->array.size() != static_cast<size_t>(c.n_layers)))
    throw Rejected("OP-CONFIG", "layers must be one policy, or one per layer");
  for (const Json& policy : layers->array) {
    const Json* kind = policy.get("kind");
    const Json* window = policy.get("window");
    bool flat = kind && kind->is(Json::Type::String) && kind->string == "flat";
    bool ring = kind && kind->is(Json::Type::String) && kind->string == "ring";
    if (!is_int(window) || !((flat && window->integer == 0) || (ring && window->integer >= 1)))
      throw Rejected("OP-CONFIG", "a layer policy is flat (window 0) or ring (window >= 1)");
    c.windows.push_back(static_cast<int>(window->integer));
  }
  if (c.windows.size() == 1) c.windows.assign(c.n_layers, c.windows[0]);
  return c;
}

class ContiguousCache {
 public:
  explicit ContiguousCache(Config c) : c_(std::move(c)), k_(c_.n_layers), v_(c_.n_layers) {}

  int used(const Json* layer_id) const { return static_cast<int>(k_[layer(layer_id)].size()); }

  void reset() {
    for (auto& rows : k_) rows.clear();
    for (auto& rows : v_) rows.clear();
  }

  // Every check first, then the append (OP-ATOMIC); the answer is the layer's whole history and an
  // EXPLICIT mask: query i attends the rows up to its own, and on a ring only the newest `window`.
  Json update_and_fetch(const Json* layer_id, const Tensor& k, const Tensor& v, const Tensor& position) {
    int l = layer(layer_id);
    const long long B = c_.batch_size, H = c_.n_kv_heads, D = c_.head_dim, Dv = c_.v_head_dim;
    const long long q = k.shape.size() == 4 ? k.shape[2] : -1;
    if (k.dtype != "float32" || v.dtype != "float32" || k.shape != std::vector<long long>{B, H, q, D} ||
        v.shape != std::vector<long long>{B, H, q, Dv} || position.dtype != "int64" ||
        position.shape != std::vector<long long>{q, 1})
      throw Rejected("OP-ARGS", "k, v, position are not [B, Hkv, q_len, D], [B, Hkv, q_len, Dv], [q_len, 1]");
    if (q < 1) throw Rejected("OP-ARGS", "q_len must be >= 1");
    const long long before = static_cast<long long>(k_[l].size());
    if (before + q > c_.capacity) throw Rejected("OP-CAP", "the step does not fit the capacity");
    for (long long i = 0; i < q; ++i) {   // a row holds every batch row and head of one token
      std::vector<float> krow, vrow;
      for (long long b = 0; b < B; ++b)
        for (long long h = 0; h < H; ++h) {
          for (long long d = 0; d < D; ++d) krow.push_back(static_cast<float>(k.data[((b * H + h) * q + i) * D + d]));
          for (long long d = 0; d < Dv; ++d) vrow.push_back(static_cast<float>(v.data[((b * H + h) * q + i) * Dv + d]));
        }
      k_[l].push_back(krow);
      v_[l].push_back(vrow);
    }
    const long long rows = before + q;
    std::vector<double> kh(B * H * rows * D), vh(B * H * rows * Dv), mask(q * rows);
    for (long long r = 0; r < rows; ++r)
      for (long long b = 0; b < B; ++b)
        for (long long h = 0; h < H; ++h) {
          for (long long d = 0; d < D; ++d) kh[((b * H + h) * rows + r) * D + d] = k_[l][r][(b * H + h) * D + d];
          for (long long d = 0; d < Dv; ++d) vh[((b * H + h) * rows + r) * Dv + d] = v_[l][r][(b * H + h) * Dv + d];
        }
    long long window = c_.windows[l];
#ifdef KVCACHE_EXAMPLE_WINDOW_OFF_BY_ONE
    if (window > 0) window += 1;
#endif
    for (long long i = 0; i < q; ++i)
      for (long long r = 0; r < rows; ++r) {
        long long own = before + i;
        mask[i * rows + r] = r <= own && (window == 0 || r > own - window);
      }
    Json attend = Json::obj();
    attend.set("kind", Json::of("EXPLICIT"));
    attend.set("mask", tensor("bool", {q, rows}, mask));
    Json answer = Json::obj();
    answer.set("k_hist", tensor("float32", {B, H, rows, D}, kh));
    answer.set("v_hist", tensor("float32", {B, H, rows, Dv}, vh));
    answer.set("attend", attend);
    return answer;
  }

 private:
  int layer(const Json* layer_id) const {   // a bool is not an int here (JSON true is not 1)
    if (!is_int(layer_id) || layer_id->integer < 0 || layer_id->integer >= c_.n_layers)
      throw Rejected("OP-ARGS", "layer_id must be an int in [0, n_layers)");
    return static_cast<int>(layer_id->integer);
  }

  Config c_;
  std::vector<std::vector<std::vector<float>>> k_, v_;   // [layer][row] -> B * H * D values
};

// --- the protocol -----------------------------------------------------------------------------------

Json error(const char* kind, const std::string& rule, const std::string& message) {
  Json e = Json::obj();
  e.set("kind", Json::of(kind));
  e.set("rule", rule.empty() ? Json::null() : Json::of(rule));
  e.set("message", Json::of(message));
  return e;
}

}  // namespace

int main() {
  std::unique_ptr<ContiguousCache> cache;
  std::string line;
  while (std::getline(std::cin, line)) {
    Json request, response = Json::obj(), params;
    std::string why;
    if (!kvcache_conformance::JsonReader(line).parse(request, why) || !request.get("method")) {
      response.set("id", Json::null());
      response.set("error", error("protocol", "", "a request is {id, method, params}"));
      std::cout << kvcache_conformance::dump(response) << std::endl;
      continue;
    }
    response.set("id", request.get("id") ? *request.get("id") : Json::null());
    const std::string method = request.get("method")->string;
    if (request.get("params")) params = *request.get("params");
    try {
      Json result;
      if (method == "hello") {
        result = Json::obj();
        Json scope = Json::arr();
        for (const char* feature : {"flat", "ring", "mla"}) scope.push(Json::of(feature));
        result.set("protocol", Json::of(kvcache_conformance::kProtocolName));
        result.set("version", Json::of(kvcache_conformance::kProtocolVersion));
        result.set("implementation", Json::of("serve_op_contiguous (C++ example)"));
        result.set("methods", Json::arr());
        result.set("layout", Json::of("op-contiguous"));
        result.set("scope", scope);
      } else if (method == "create") {
        cache.reset();
        const Json* config = params.get("config");
        if (!config || !config->is(Json::Type::Object)) throw Rejected("OP-CONFIG", "config is an object");
        cache = std::make_unique<ContiguousCache>(read_config(*config));
      } else if (method == "bye") {
        std::cout << kvcache_conformance::dump((response.set("result", Json::null()), response)) << std::endl;
        return 0;
      } else if (!cache) {
        throw std::invalid_argument("no cache: send create first");
      } else if (method == "update_and_fetch") {
        result = cache->update_and_fetch(params.get("layer_id"), read_tensor(params.get("k"), "k"),
                                         read_tensor(params.get("v"), "v"), read_tensor(params.get("position"), "position"));
      } else if (method == "used") {
        result = Json::of(cache->used(params.get("layer_id")));
      } else if (method == "reset") {
        cache->reset();
      } else {
        throw std::invalid_argument("unknown method " + method);
      }
      response.set("result", result);
    } catch (const Rejected& r) {
      response.set("error", error("rejected", r.rule, r.what()));
    } catch (const std::invalid_argument& e) {
      response.set("error", error("protocol", "", e.what()));
    }
    std::cout << kvcache_conformance::dump(response) << std::endl;
  }
  return 0;
}
