// kvcache_conformance.hpp - header-only C++17 driver for the kvcache conformance suite.
//
// Turns a C++ KV cache into a `cmd:` target speaking spec/PROTOCOL.md (version 1) on stdin/stdout. Three
// drivers, one per kind of cache (the third, paged::run_main for a serving engine's block pool with prefix
// caching, is at the very end: spec/PROTOCOL.md, "The C++ paged driver"):
//
// The op face (`update_and_fetch(layer, k, v, position)` answering the K/V history and an AttendSpec,
// as ExecuTorch 1.5.1's caches and the MLX runtime's): op::run_main, one call with a factory from the op
// config and a fetch converting the tensors (the whole API is in `namespace op`, near the end of this
// file; spec/PROTOCOL.md, "The C++ op driver"; spec/cpp/example/serve_mlx_shaped.cpp is a whole target):
//
//     namespace op = kvcache_conformance::op;
//     int main(int argc, char** argv) {
//       return op::run_main<MyCache>(argc, argv, "my op cache", op::Scope::full().without("batch"),
//           [](const op::Config& c) { return std::make_unique<MyCache>(to_my_config(c)); },
//           [](MyCache& cache, int layer, const op::Tensor& k, const op::Tensor& v, const op::Tensor& position) {
//             auto answer = cache.update_and_fetch(layer, op::int32s(position), to_mine(k), to_mine(v));
//             return op::Fetched{op::Tensor::of("float32", ...), ..., op::Mask::Explicit, mask};
//           });   // mask: op::Tensor::of("bool", {q_len, rows}, bits), bits[i * rows + j]: query i attends row j
//     }
//
//     ./my_op_target --help               # this usage; with no argument it serves the protocol:
//     kvcache conformance --target cmd:./my_op_target --strict
//
// The plan faces (upstream's SequenceCache and cell cache: plan/commit, place_step): run_main, which
// also replays the golden vectors (spec/vectors/kvcache_vectors.json) without Python:
//
//     #include "kvcache_conformance.hpp"
//     int main(int argc, char** argv) {
//       return kvcache_conformance::run_main<MyCache, MyCacheConfig>(argc, argv, "my-cache 1.0");
//     }
//
//     ./my_target                         # serve the protocol: kvcache conformance --target cmd:./my_target
//     ./my_target --vectors FILE.json     # replay golden vectors, or a finding saved by
//                                         # `kvcache conformance --save-findings DIR`; exit 0 when all pass
//
// A cache that implements part of the spec declares its scope (spec/PROTOCOL.md, "Scope"): the layer
// kinds it implements. ExecuTorch's first version (PR #21412) is flat-only:
//
//     return kvcache_conformance::run_main<MyCache, MyCacheConfig>(argc, argv, "my-cache",
//                                                                   kvcache_conformance::Scope::flat_only());
//
// The driver announces the scope in `hello` (the kinds, plus "max_write" when Config has that field)
// and skips the golden vectors outside it (NEEDS-* / WITHOUT-* flags). It does not filter layer kinds:
// a config outside the scope reaches your constructor, which must refuse it (throw; SCOPE-BORDER).
//
// Requirements on Cache (upstream's shapes, duck-typed):
//   - constructible from `const Config&` (or pass a factory: std::unique_ptr<Cache>(const Config&));
//   - plan(int layer, int position, int T) -> std::optional<Plan>, Plan with Run write[2], int n_write,
//     Run read[2], int n_read, int read_base_pos; Run with int start, int len;
//   - commit(const Plan&) (void, or bool where false means rejected); can_extend(int) -> bool;
//     capacity() -> int; rewind(int) -> bool; clear();
// Requirements on Config: capacity, n_layers, layers (a vector of {policy{kind}, ...}); kind is an enum
// with Flat = 0, Ring = 1. Other fields and members are free (kv_dtype, valid(), ...): the driver
// value-initializes the Config and sets only what it detects.
//
// Detected (compile-time, SFINAE; absent is fine):
//   - Cache methods length(), depth(int), retained_from(int), as_control()/as_planner(): absent ones
//     are announced absent in hello and their vector calls skipped;
//   - Config fields max_write (std::optional<int>) and initial_capacity (int); LayerConfig fields
//     n_kv_heads, head_dim (int); LayerPolicy field window (int).
//   A config field the struct lacks cannot reach the cache, so the driver accepts only the value
//   that means "nothing" for it and rejects any other at the JSON boundary, naming the field:
//   max_write null (else SCOPE-BORDER: such a Config is outside the max_write scope), initial_capacity
//   512 (its default), window 0 (a ring layer needs a window), n_kv_heads / head_dim >= 1 (CFG-SHAPE).
//
// The cell layout (PR #21902): a Cache with place_step(int layer, const int32_t* positions, int length)
// -> const CellStep* (CellStep with int length, int read_len, const int32_t* cells, const uint8_t*
// mask_bits) is driven as a cell cache - the same run_main, the hello says "layout": "cell" - and needs
// declare_step(const std::vector<int32_t>&) -> bool, seq_new() -> std::optional<int32_t>,
// seq_clone(int32_t, std::optional<int>) -> std::optional<int32_t>, seq_rm(int32_t, int,
// std::optional<int>) -> bool, seq_len(int32_t), next_pos(int32_t), free_cells(), used_end(),
// can_extend, capacity, clear; faces as_batch_control()/as_cell_stepper() and a public
// live(int32_t) -> bool (the live ids are listed from it; private or absent: "live" is announced
// absent) are detected. A cell cache is built by a factory receiving the config's max_seqs,
//     std::unique_ptr<Cache>(const Config&, int max_seqs),
// or, without one, as Cache(config, max_seqs) when that constructor exists, else Cache(config) -
// chosen at compile time, so upstream's `explicit CellCache(const CacheConfig&)` compiles. A cache
// with a fixed id count (upstream's kMaxSeqs = 64) declares it in its scope; the driver then refuses
// every other max_seqs itself (SCOPE-BORDER) before the factory runs:
//
//     return kvcache_conformance::run_main<CellCache, CacheConfig>(argc, argv, "my cell cache",
//         kvcache_conformance::Scope::full().fixed_max_seqs(64),
//         [](const CacheConfig& c, int /*max_seqs*/) { return std::make_unique<CellCache>(c); });
//
// A cache built from the config alone whose class has a public `static constexpr int kMaxSeqs` needs
// neither: with no factory and no max_seqs in the scope, the driver takes kMaxSeqs as the fixed one,
//     return kvcache_conformance::run_main<CellCache, CacheConfig>(argc, argv, "my cell cache");
//
// An op-face cache (`update_and_fetch`, one sequence) has its own driver, op::run_main (at the end of
// this file; spec/PROTOCOL.md, "The C++ op driver").
//
// `--vectors` runs each test in a child process (POSIX): a test that crashes or hangs is that test's
// failure ("crashed: killed by SIGSEGV"), and the replay still ends with its summary.
//
// A C++ `int` parameter cannot receive `true`, `1.5` or 2^31: the driver rejects such arguments
// at the JSON boundary (rule ARG-INT / ARG-RANGE). Negatives, zero T, gaps and forged plans reach
// the implementation. A std::exception thrown by the implementation is a rejection ("rejected").
// Define KVCACHE_CONFORMANCE_NO_RTTI when compiling with -fno-rtti (faces are then compared by
// address without dynamic_cast).
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#define KVCACHE_CONFORMANCE_FORK 1  // --vectors runs each test in a child process (a crash is that test's failure)
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#endif

namespace kvcache_conformance {

inline constexpr int kProtocolVersion = 1;
inline constexpr const char* kProtocolName = "kvcache-conformance";

// --- a tiny JSON value, reader and writer ----------------------------------------------------------

struct Json {
  enum class Type { Null, Bool, Int, Double, String, Array, Object };
  Type type = Type::Null;
  bool boolean = false;
  long long integer = 0;
  bool big = false;  // an integer literal outside long long: kept as a double
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;  // insertion order; written sorted

  static Json null() { return Json{}; }
  static Json of(bool b) { Json j; j.type = Type::Bool; j.boolean = b; return j; }
  static Json of(int i) { Json j; j.type = Type::Int; j.integer = i; return j; }
  static Json of(long long i) { Json j; j.type = Type::Int; j.integer = i; return j; }
  static Json of(const std::string& s) { Json j; j.type = Type::String; j.string = s; return j; }
  static Json of(const char* s) { return of(std::string(s)); }
  static Json arr() { Json j; j.type = Type::Array; return j; }
  static Json obj() { Json j; j.type = Type::Object; return j; }

  bool is(Type t) const { return type == t; }
  const Json* get(const std::string& key) const {
    if (type != Type::Object) return nullptr;
    for (const auto& kv : object)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
  Json& set(const std::string& key, Json value) {
    for (auto& kv : object)
      if (kv.first == key) return kv.second = std::move(value);
    object.emplace_back(key, std::move(value));
    return object.back().second;
  }
  Json& push(Json value) { array.push_back(std::move(value)); return array.back(); }
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& text) : s_(text) {}
  // Parses one complete value; false (and `error`) on anything else.
  bool parse(Json& out, std::string& error) {
    try {
      out = value(0);
      skip();
      if (pos_ != s_.size()) fail("trailing characters");
      return true;
    } catch (const std::runtime_error& e) {
      error = e.what();
      return false;
    }
  }

 private:
  const std::string& s_;
  size_t pos_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(pos_));
  }
  void skip() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool literal(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(pos_, n, word) == 0) { pos_ += n; return true; }
    return false;
  }
  Json value(int depth) {
    if (depth > 64) fail("nesting too deep");
    skip();
    if (pos_ >= s_.size()) fail("unexpected end");
    char c = s_[pos_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Json::of(string());
    if (literal("null")) return Json::null();
    if (literal("true")) return Json::of(true);
    if (literal("false")) return Json::of(false);
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail(std::string("unexpected character '") + c + "'");
  }
  Json object(int depth) {
    Json j = Json::obj();
    ++pos_;
    skip();
    if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return j; }
    for (;;) {
      skip();
      if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a key");
      std::string key = string();
      skip();
      if (pos_ >= s_.size() || s_[pos_] != ':') fail("expected ':'");
      ++pos_;
      j.set(key, value(depth + 1));
      skip();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return j; }
      fail("expected ',' or '}'");
    }
  }
  Json array(int depth) {
    Json j = Json::arr();
    ++pos_;
    skip();
    if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return j; }
    for (;;) {
      j.push(value(depth + 1));
      skip();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return j; }
      fail("expected ',' or ']'");
    }
  }
  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) { out += static_cast<char>(cp); }
    else if (cp < 0x800) { out += static_cast<char>(0xC0 | (cp >> 6)); out += static_cast<char>(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12)); out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18)); out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)); out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("short \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') v |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= static_cast<unsigned>(h - 'A' + 10);
      else fail("bad \\u escape");
    }
    return v;
  }
  std::string string() {
    std::string out;
    ++pos_;  // opening quote
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') { out += c; continue; }
      if (pos_ >= s_.size()) break;
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.compare(pos_, 2, "\\u") == 0) {
            pos_ += 2;
            unsigned low = hex4();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
    fail("unterminated string");
  }
  Json number() {
    size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    bool integral = true;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c >= '0' && c <= '9') { ++pos_; continue; }
      if (c == '.' || c == 'e' || c == 'E' || c == '+' || (c == '-' && pos_ > start)) { integral = false; ++pos_; continue; }
      break;
    }
    std::string text = s_.substr(start, pos_ - start);
    if (text == "-" || text.empty()) fail("bad number");
    Json j;
    if (integral) {
      errno = 0;
      char* end = nullptr;
      long long v = std::strtoll(text.c_str(), &end, 10);
      if (errno == 0 && end && *end == '\0') { j.type = Json::Type::Int; j.integer = v; return j; }
      j.type = Json::Type::Int;  // an integer too large for long long: still an integer, out of every range
      j.big = true;
      j.integer = text[0] == '-' ? LLONG_MIN : LLONG_MAX;
      return j;
    }
    j.type = Json::Type::Double;
    j.number = std::strtod(text.c_str(), nullptr);
    return j;
  }
};

inline void write_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// Canonical text: object keys sorted, no spaces. Two values are equal iff their texts are.
inline void write(std::string& out, const Json& j) {
  switch (j.type) {
    case Json::Type::Null: out += "null"; break;
    case Json::Type::Bool: out += j.boolean ? "true" : "false"; break;
    case Json::Type::Int: out += j.big ? (j.integer < 0 ? "-1e999" : "1e999") : std::to_string(j.integer); break;
    case Json::Type::Double: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", j.number);
      out += buf;
      break;
    }
    case Json::Type::String: write_string(out, j.string); break;
    case Json::Type::Array:
      out += '[';
      for (size_t k = 0; k < j.array.size(); ++k) { if (k) out += ','; write(out, j.array[k]); }
      out += ']';
      break;
    case Json::Type::Object: {
      std::vector<const std::pair<std::string, Json>*> items;
      for (const auto& kv : j.object) items.push_back(&kv);
      std::sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += ',';
        write_string(out, items[k]->first);
        out += ':';
        write(out, items[k]->second);
      }
      out += '}';
      break;
    }
  }
}

inline std::string dump(const Json& j) { std::string out; write(out, j); return out; }

// --- detection idiom for the optional methods and config fields -----------------------------------

template <class C, class = void> struct has_length : std::false_type {};
template <class C> struct has_length<C, std::void_t<decltype(std::declval<C&>().length())>> : std::true_type {};
template <class C, class = void> struct has_depth : std::false_type {};
template <class C> struct has_depth<C, std::void_t<decltype(std::declval<C&>().depth(0))>> : std::true_type {};
template <class C, class = void> struct has_retained_from : std::false_type {};
template <class C>
struct has_retained_from<C, std::void_t<decltype(std::declval<C&>().retained_from(0))>> : std::true_type {};
template <class C, class = void> struct has_faces : std::false_type {};
template <class C>
struct has_faces<C, std::void_t<decltype(std::declval<C&>().as_control()), decltype(std::declval<C&>().as_planner())>>
    : std::true_type {};

template <class C, class = void> struct has_max_write : std::false_type {};
template <class C> struct has_max_write<C, std::void_t<decltype(std::declval<C&>().max_write)>> : std::true_type {};
template <class C, class = void> struct has_initial_capacity : std::false_type {};
template <class C>
struct has_initial_capacity<C, std::void_t<decltype(std::declval<C&>().initial_capacity)>> : std::true_type {};
template <class C, class = void> struct has_window : std::false_type {};
template <class C> struct has_window<C, std::void_t<decltype(std::declval<C&>().window)>> : std::true_type {};
template <class C, class = void> struct has_n_kv_heads : std::false_type {};
template <class C> struct has_n_kv_heads<C, std::void_t<decltype(std::declval<C&>().n_kv_heads)>> : std::true_type {};
template <class C, class = void> struct has_head_dim : std::false_type {};
template <class C> struct has_head_dim<C, std::void_t<decltype(std::declval<C&>().head_dim)>> : std::true_type {};

// The cell layout: detected by place_step; the sequence faces' plan type is then a placeholder.
template <class C, class = void> struct is_cell_cache : std::false_type {};
template <class C>
struct is_cell_cache<C, std::void_t<decltype(std::declval<C&>().place_step(0, static_cast<const int32_t*>(nullptr), 0))>>
    : std::true_type {};
// live(int32_t) -> bool, if it is public: upstream's cell cache keeps its live set private. Access is
// part of the substitution, so a private live() is detected as absent, not a compile error.
// A cell cache's public `static constexpr int kMaxSeqs` (upstream's fixed id count): the id count it
// serves when no factory can hand it another one.
template <class C, class = void> struct has_k_max_seqs : std::false_type {};
template <class C>
struct has_k_max_seqs<C, std::enable_if_t<std::is_convertible_v<decltype(C::kMaxSeqs), int>>> : std::true_type {};
template <class C, class = void> struct has_live : std::false_type {};
template <class C>
struct has_live<C, std::void_t<decltype(static_cast<bool>(std::declval<C&>().live(int32_t{0})))>>
    : std::true_type {};
template <class C, class = void> struct has_cell_faces : std::false_type {};
template <class C>
struct has_cell_faces<C, std::void_t<decltype(std::declval<C&>().as_batch_control()),
                                     decltype(std::declval<C&>().as_cell_stepper())>> : std::true_type {};
struct NoRun { int start = 0, len = 0; };
struct NoPlan { NoRun write[2]; int n_write = 0; NoRun read[2]; int n_read = 0; int read_base_pos = 0; };
template <class C, class = void> struct plan_of { using type = NoPlan; };
template <class C>
struct plan_of<C, std::void_t<decltype(std::declval<C&>().plan(0, 0, 0))>> {
  using type = typename std::decay_t<decltype(std::declval<C&>().plan(0, 0, 0))>::value_type;
};

// The part of the spec a cache implements (SCOPE-BORDER): its layer kinds, and for a cell cache the
// one max_seqs it serves when that is fixed (upstream's kMaxSeqs = 64, a constructor without max_seqs):
//     Scope::full().fixed_max_seqs(64)
// "max_write" joins the announced scope by itself when Config has that field.
struct Scope {
  std::vector<std::string> layer_kinds;
  std::optional<int> max_seqs;  // empty: every max_seqs reaches the factory
  explicit Scope(std::vector<std::string> kinds = {"flat", "ring"}) : layer_kinds(std::move(kinds)) {}
  static Scope flat_only() { return Scope({"flat"}); }
  static Scope full() { return Scope(); }
  Scope fixed_max_seqs(int n) const {
    Scope fixed = *this;
    fixed.max_seqs = n;
    return fixed;
  }
};

inline std::string signal_name(int signal) {
#ifdef KVCACHE_CONFORMANCE_FORK
  switch (signal) {
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGALRM: return "SIGALRM";
    default: break;
  }
#endif
  return "signal " + std::to_string(signal);
}

template <class T> const void* object_address(T* p) {
#ifndef KVCACHE_CONFORMANCE_NO_RTTI
  if constexpr (std::is_polymorphic_v<T>) return p ? dynamic_cast<const void*>(p) : nullptr;
#endif
  return static_cast<const void*>(p);
}
template <class T> const void* object_address(T& r) { return object_address(&r); }

// FACES: is `face` (a pointer or a reference returned by as_control / as_planner) the cache itself?
// When Cache derives from the face type, compare with the upcast (exact, no RTTI needed); otherwise
// compare most-derived addresses.
template <class Cache, class Face> bool is_this_object(Cache& cache, Face&& face) {
  using Pointer = std::conditional_t<std::is_pointer_v<std::decay_t<Face>>, std::decay_t<Face>,
                                     std::add_pointer_t<std::remove_reference_t<Face>>>;
  Pointer pointer;
  if constexpr (std::is_pointer_v<std::decay_t<Face>>) pointer = face; else pointer = &face;
  if constexpr (std::is_convertible_v<Cache*, Pointer>) return pointer == static_cast<Pointer>(&cache);
  return object_address(pointer) == object_address(&cache);
}

// --- the driver ------------------------------------------------------------------------------------

struct Response {
  bool ok = true;
  Json value;
  std::string kind;  // rejected | unsupported | protocol
  std::string rule;
  std::string message;

  static Response result(Json v) { Response r; r.value = std::move(v); return r; }
  static Response error(const std::string& kind, const std::string& rule, const std::string& message) {
    Response r;
    r.ok = false;
    r.kind = kind;
    r.rule = rule;
    r.message = message;
    return r;
  }
};

// Whether a hello's `versions` offer the version this header speaks.
inline bool offers_our_version(const Json& params) {
  const Json* versions = params.get("versions");
  bool offered = false;
  if (versions && versions->is(Json::Type::Array))
    for (const Json& v : versions->array) offered |= v.is(Json::Type::Int) && v.integer == kProtocolVersion;
  return offered;
}

// The protocol's framing, shared by the plan-face and op-face drivers: one request per line, one
// response per request (spec/PROTOCOL.md, "Framing"), until `bye` or end of input.
template <class Handler>
int serve_requests(std::istream& in, std::ostream& out, Handler&& handle) {
  std::string line;
  while (std::getline(in, line)) {
    Json request;
    std::string error;
    Json id = Json::null();
    Response response;
    bool bye = false;
    if (!JsonReader(line).parse(request, error) || !request.is(Json::Type::Object)) {
      response = Response::error("protocol", "", error.empty() ? "a request is an object" : error);
    } else {
      if (const Json* i = request.get("id")) id = *i;
      const Json* m = request.get("method");
      const Json* p = request.get("params");
      Json params = p ? *p : Json::obj();
      if (!m || !m->is(Json::Type::String)) {
        response = Response::error("protocol", "", "missing method");
      } else {
        bye = m->string == "bye";
        response = handle(m->string, params);
      }
    }
    Json reply = Json::obj();
    reply.set("id", id);
    if (response.ok) {
      reply.set("result", response.value);
    } else {
      Json e = Json::obj();
      e.set("kind", Json::of(response.kind));
      e.set("rule", response.rule.empty() ? Json::null() : Json::of(response.rule));
      e.set("message", Json::of(response.message));
      reply.set("error", e);
    }
    out << dump(reply) << '\n' << std::flush;
    if (bye) break;
  }
  return 0;
}

template <class Cache, class Config>
class Driver {
 public:
  static constexpr bool kCells = is_cell_cache<Cache>::value;
  // A cell cache's factory receives the config's max_seqs (absent: 64); a sequence cache's, the config.
  using Factory = std::conditional_t<kCells, std::function<std::unique_ptr<Cache>(const Config&, int max_seqs)>,
                                     std::function<std::unique_ptr<Cache>(const Config&)>>;
  using PlanT = typename plan_of<Cache>::type;
  using LayerT = typename std::decay_t<decltype(std::declval<Config&>().layers)>::value_type;

  explicit Driver(std::string name, Factory factory = nullptr, Scope scope = Scope::full())
      : name_(std::move(name)), max_seqs_ignored_(!factory && !receives_max_seqs()),
        factory_(factory ? std::move(factory) : default_factory()), scope_(std::move(scope)) {
    // A cell cache built from the config alone, with a public kMaxSeqs and no max_seqs in the scope:
    // that constant is the one max_seqs it serves (spec/PROTOCOL.md, "The C++ driver").
    if constexpr (kCells && has_k_max_seqs<Cache>::value)
      if (max_seqs_ignored_ && !scope_.max_seqs) scope_ = scope_.fixed_max_seqs(static_cast<int>(Cache::kMaxSeqs));
  }

  // Without a factory: construct from (config, max_seqs), or from the config alone. Only the
  // constructor the type has is instantiated, so a cache shaped like upstream's (config only)
  // compiles; a type with neither compiles too and needs a factory (create says so).
  static constexpr bool receives_max_seqs() {
    if constexpr (kCells) return std::is_constructible_v<Cache, const Config&, int>;
    return true;
  }
  static Factory default_factory() {
    if constexpr (kCells && std::is_constructible_v<Cache, const Config&, int>)
      return [](const Config& c, int max_seqs) { return std::make_unique<Cache>(c, max_seqs); };
    else if constexpr (kCells && std::is_constructible_v<Cache, const Config&>)
      return [](const Config& c, int) { return std::make_unique<Cache>(c); };  // the scope must fix max_seqs
    else if constexpr (!kCells && std::is_constructible_v<Cache, const Config&>)
      return [](const Config& c) { return std::make_unique<Cache>(c); };
    else
      return nullptr;
  }

  // The features announced in hello: the layer kinds, max_write when Config has the field, and
  // "max_seqs=N" when the scope fixes max_seqs.
  std::vector<std::string> features() const {
    std::vector<std::string> out = scope_.layer_kinds;
    if constexpr (has_max_write<Config>::value) out.push_back("max_write");
    if (scope_.max_seqs) out.push_back("max_seqs=" + std::to_string(*scope_.max_seqs));
    return out;
  }
  bool implements(const std::string& feature) const {
    std::vector<std::string> all = features();
    return std::find(all.begin(), all.end(), feature) != all.end();
  }
  // A golden-vector test is for this target unless it needs a feature outside the scope (NEEDS-X),
  // checks the border of a scope that leaves out a feature this target implements (WITHOUT-X), or its
  // group's config has another max_seqs than the one the scope fixes (read from the config itself).
  bool applies(const Json& flags, const Json* config) const {
    static const std::pair<const char*, const char*> kFeatures[] = {
        {"FLAT", "flat"}, {"RING", "ring"}, {"MAX-WRITE", "max_write"}};
    for (const Json& flag : flags.array) {
      if (!flag.is(Json::Type::String)) continue;
      for (const auto& f : kFeatures) {
        if (flag.string == std::string("NEEDS-") + f.first && !implements(f.second)) return false;
        if (flag.string == std::string("WITHOUT-") + f.first && implements(f.second)) return false;
      }
      if (flag.string == "WITHOUT-MAX-SEQS" && !scope_.max_seqs) return false;
    }
    return !(config && config->is(Json::Type::Object) && outside_max_seqs(*config));
  }
  // A cell config whose max_seqs is not the one the scope fixes (absent: 64).
  bool outside_max_seqs(const Json& config) const {
    if (!kCells || !scope_.max_seqs) return false;
    const Json* m = config.get("max_seqs");
    return m ? !(m->is(Json::Type::Int) && !m->big && m->integer == *scope_.max_seqs) : *scope_.max_seqs != 64;
  }

  Json methods() const {
    Json m = Json::arr();
    if constexpr (has_length<Cache>::value) m.push(Json::of("length"));
    if constexpr (has_depth<Cache>::value) m.push(Json::of("depth"));
    if constexpr (has_retained_from<Cache>::value) m.push(Json::of("retained_from"));
    if constexpr (kCells && has_live<Cache>::value) m.push(Json::of("live"));
    return m;
  }
  bool supports(const std::string& method) const {
    if (method == "length") return has_length<Cache>::value;
    if (method == "depth") return has_depth<Cache>::value;
    if (method == "retained_from") return has_retained_from<Cache>::value;
    if (method == "live") return has_live<Cache>::value;
    return true;
  }

  Response handle(const std::string& method, const Json& params) {
    try {
      return dispatch(method, params);
    } catch (const std::exception& e) {
      return Response::error("rejected", "", std::string("exception: ") + e.what());
    }
  }

  // Serve the protocol until `bye` or end of input.
  int serve(std::istream& in, std::ostream& out) {
    return serve_requests(in, out, [this](const std::string& method, const Json& params) {
      return handle(method, params);
    });
  }

  // Replay the golden vectors; prints failures to `err`, a summary to `out`; 0 when all pass.
  int replay_vectors(const std::string& path, std::ostream& out, std::ostream& err) {
    std::ifstream file(path, std::ios::binary);
    if (!file) { err << "cannot read " << path << "\n"; return 2; }
    std::stringstream buffer;
    buffer << file.rdbuf();
    std::string text = buffer.str();
    Json doc;
    std::string error;
    if (!JsonReader(text).parse(doc, error)) { err << path << ": " << error << "\n"; return 2; }
    const Json* version = doc.get("formatVersion");
    if (!version || !version->is(Json::Type::Int) || version->integer != 1) {
      err << path << ": unsupported formatVersion\n";
      return 2;
    }
    if (const Json* finding = doc.get("finding")) {  // a file written by --save-findings
      auto text = [&](const char* key) {
        const Json* v = finding->get(key);
        return v && v->is(Json::Type::String) ? v->string : std::string("?");
      };
      err << "replaying a finding: " << text("class") << " " << text("rule") << ": " << text("message") << "\n"
          << std::flush;  // printed first: a crash on replay still says what was being replayed
    }
    int passed = 0, failed = 0, crashed = 0, skipped = 0, outside = 0;
    const Json* groups = doc.get("testGroups");
    for (const Json& group : groups ? groups->array : std::vector<Json>{}) {
      const Json* config = group.get("config");
      for (const Json& test : group.get("tests")->array) {
        const Json* flags = test.get("flags");
        if ((flags && !applies(*flags, config)) || (!flags && config && config->is(Json::Type::Object) &&
                                                    outside_max_seqs(*config))) {
          ++outside;
          continue;
        }
        bool died = false;
        std::string problem = replay_isolated(config, test, skipped, died, out, err);
        if (problem.empty()) {
          ++passed;
        } else {
          ++failed;
          crashed += died;
          if (failed <= 20 || died)
            err << "tcId " << test.get("tcId")->integer << " (" << test.get("comment")->string << "): " << problem << "\n";
        }
      }
    }
    if (doc.get("finding") && outside)
      err << "the finding lies outside the scope this target declares: not replayed\n";
    out << "vectors: " << passed << " passed, " << failed << " failed";
    if (crashed) out << " (" << crashed << " crashed)";
    out << ", " << outside << " tests outside the scope skipped, " << skipped
        << " calls to absent optional methods skipped\n";
    return failed ? 1 : 0;
  }

  // One test in a child process (POSIX): a crash (SIGSEGV, abort, exit) or a hang (test_seconds) of the
  // implementation is that test's failure, and the replay goes on to its summary. Elsewhere, in process.
  // KVCACHE_CONFORMANCE_TEST_SECONDS overrides the 60 s a test may take.
  static unsigned test_seconds() {
    const char* text = std::getenv("KVCACHE_CONFORMANCE_TEST_SECONDS");
    long seconds = text ? std::strtol(text, nullptr, 10) : 0;
    return seconds > 0 && seconds < 86400 ? static_cast<unsigned>(seconds) : 60;
  }
  std::string replay_isolated(const Json* config, const Json& test, int& skipped, bool& died, std::ostream& out,
                              std::ostream& err) {
#ifdef KVCACHE_CONFORMANCE_FORK
    out.flush();
    err.flush();
    std::fflush(nullptr);  // nothing buffered twice
    int fds[2];
    if (pipe(fds) != 0) return replay_test(config, test, skipped);
    pid_t child = fork();
    if (child < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      return replay_test(config, test, skipped);
    }
    if (child == 0) {
      ::close(fds[0]);
      alarm(test_seconds());
      int child_skipped = 0;
      std::string problem = replay_test(config, test, child_skipped);
      std::string answer = "done " + std::to_string(child_skipped) + "\n" + problem;
      for (size_t at = 0; at < answer.size();) {
        ssize_t n = ::write(fds[1], answer.data() + at, answer.size() - at);
        if (n <= 0) break;
        at += static_cast<size_t>(n);
      }
      std::cout.flush();
      std::cerr.flush();
      std::fflush(nullptr);
      _exit(0);  // no destructors or atexit handlers of the parent's objects
    }
    ::close(fds[1]);
    std::string answer;
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      answer.append(buf, static_cast<size_t>(n));
    }
    ::close(fds[0]);
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {}
    died = true;
    if (WIFSIGNALED(status)) {
      int sig = WTERMSIG(status);
      return "crashed: killed by " + signal_name(sig) +
             (sig == SIGALRM ? " (no answer within " + std::to_string(test_seconds()) + " s: a hang)" : "");
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      return "crashed: the process exited with status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    if (answer.compare(0, 5, "done ") != 0) return "crashed: the process exited (status 0) in the middle of the test";
    died = false;
    size_t newline = answer.find('\n');
    skipped += std::atoi(answer.substr(5, newline - 5).c_str());
    return newline == std::string::npos ? std::string() : answer.substr(newline + 1);
#else
    died = false;
    (void)out;
    (void)err;
    return replay_test(config, test, skipped);
#endif
  }

 private:
  std::string name_;
  bool max_seqs_ignored_;  // a cell cache built from the config alone: max_seqs cannot reach it
  Factory factory_;
  Scope scope_;
  std::unique_ptr<Cache> cache_;

  static bool to_int(const Json& v, int& out, std::string& rule) {
    if (!v.is(Json::Type::Int)) { rule = "ARG-INT"; return false; }  // bool, float, string: not an int
    if (v.big || v.integer < INT_MIN || v.integer > INT_MAX) { rule = "ARG-RANGE"; return false; }
    out = static_cast<int>(v.integer);
    return true;
  }

  // Reads int parameters in order; on failure fills `bad` with a rejection.
  static bool ints(const Json& params, std::initializer_list<std::pair<const char*, int*>> wanted, Response& bad) {
    for (const auto& w : wanted) {
      const Json* v = params.get(w.first);
      if (!v) { bad = Response::error("protocol", "", std::string("missing parameter ") + w.first); return false; }
      std::string rule;
      if (!to_int(*v, *w.second, rule)) {
        bad = Response::error("rejected", rule, std::string(w.first) + " is not a C++ int");
        return false;
      }
    }
    return true;
  }

  static Json runs_json(const decltype(PlanT::write)& runs, int n) {
    Json a = Json::arr();
    for (int k = 0; k < std::min(std::max(n, 0), 2); ++k) {
      Json run = Json::arr();
      run.push(Json::of(static_cast<long long>(runs[k].start)));
      run.push(Json::of(static_cast<long long>(runs[k].len)));
      a.push(run);
    }
    return a;
  }

  static Json plan_json(const PlanT& p) {
    Json j = Json::obj();
    j.set("write", runs_json(p.write, p.n_write));
    j.set("read", runs_json(p.read, p.n_read));
    j.set("read_base_pos", Json::of(static_cast<long long>(p.read_base_pos)));
    return j;
  }

  static bool runs_from(const Json* a, decltype(PlanT::write)& runs, int& n, std::string& why) {
    if (!a || !a->is(Json::Type::Array)) { why = "runs are not an array"; return false; }
    if (a->array.size() > 2) { why = "more than two runs do not fit Run[2]"; return false; }
    n = static_cast<int>(a->array.size());
    for (size_t k = 0; k < a->array.size(); ++k) {
      const Json& run = a->array[k];
      int start = 0, len = 0;
      std::string rule;
      if (!run.is(Json::Type::Array) || run.array.size() != 2 || !to_int(run.array[0], start, rule) ||
          !to_int(run.array[1], len, rule)) {
        why = "a run is not [int, int]";
        return false;
      }
      runs[k].start = start;
      runs[k].len = len;
    }
    return true;
  }

  // A JSON plan as the implementation's plan type; false when it cannot be represented at all.
  static bool plan_from(const Json& j, PlanT& p, std::string& rule, std::string& why) {
    if (!j.is(Json::Type::Object)) { rule = "ARG-TYPE"; why = "plan is not an object"; return false; }
    rule = "PLAN-SHAPE";
    p = PlanT{};
    if (!runs_from(j.get("write"), p.write, p.n_write, why) || !runs_from(j.get("read"), p.read, p.n_read, why))
      return false;
    const Json* base = j.get("read_base_pos");
    std::string int_rule;
    if (!base || !to_int(*base, p.read_base_pos, int_rule)) { why = "read_base_pos is not an int"; return false; }
    return true;
  }

  static bool config_from(const Json& j, Config& c, std::string& rule, std::string& why) {
    using PolicyT = std::decay_t<decltype(std::declval<LayerT&>().policy)>;
    using KindT = std::decay_t<decltype(std::declval<PolicyT&>().kind)>;
    rule = "CFG-TYPE";
    if (!j.is(Json::Type::Object)) { why = "config is not an object"; return false; }
    auto field = [&](const Json& from, const char* name, int& out, bool required = true) {
      const Json* v = from.get(name);
      if (!v) { if (required) why = std::string("missing ") + name; return !required; }
      std::string r;
      if (!to_int(*v, out, r)) { why = std::string(name) + " is not a C++ int"; return false; }
      return true;
    };
    // A field the struct lacks: only the value that means "nothing" for it may be dropped.
    auto absent = [&](const char* type, const char* name, const char* the_rule, const char* meaning) {
      rule = the_rule;
      why = std::string("this ") + type + " has no " + name + " field: " + meaning;
      return false;
    };
    int capacity = 0, n_layers = 0, initial_capacity = 512;
    if (!field(j, "capacity", capacity) || !field(j, "n_layers", n_layers) ||
        !field(j, "initial_capacity", initial_capacity, false))
      return false;
    c.capacity = capacity;
    c.n_layers = n_layers;
    if constexpr (has_initial_capacity<Config>::value) {
      c.initial_capacity = initial_capacity;
    } else if (initial_capacity != 512) {
      return absent("CacheConfig", "initial_capacity", "CFG-INITIAL-CAPACITY", "only the default 512 can be served");
    }
    const Json* mw = j.get("max_write");
    if (mw && !mw->is(Json::Type::Null)) {
      int m = 0;
      if (!field(j, "max_write", m)) return false;
      if constexpr (has_max_write<Config>::value) c.max_write = m;
      else return absent("CacheConfig", "max_write", "SCOPE-BORDER", "a config setting it is outside this cache's scope");
    } else {
      if constexpr (has_max_write<Config>::value) c.max_write = std::nullopt;
    }
    const Json* layers = j.get("layers");
    if (!layers || !layers->is(Json::Type::Array)) { why = "layers is not an array"; return false; }
    c.layers.clear();
    for (const Json& l : layers->array) {
      LayerT layer{};
      const Json* kind = l.get("kind");
      if (!kind || !kind->is(Json::Type::String) || (kind->string != "flat" && kind->string != "ring")) {
        rule = "CFG-POLICY";
        why = "kind is not \"flat\" or \"ring\"";
        return false;
      }
      layer.policy.kind = static_cast<KindT>(kind->string == "flat" ? 0 : 1);
      int window = 0, heads = 0, dim = 0;
      if (!field(l, "window", window) || !field(l, "n_kv_heads", heads) || !field(l, "head_dim", dim)) return false;
      if constexpr (has_window<PolicyT>::value) layer.policy.window = window;
      else if (window != 0) return absent("LayerPolicy", "window", "CFG-POLICY", "only window 0 (flat) can be served");
      if constexpr (has_n_kv_heads<LayerT>::value) layer.n_kv_heads = heads;
      else if (heads < 1) return absent("LayerConfig", "n_kv_heads", "CFG-SHAPE", "it must still be >= 1");
      if constexpr (has_head_dim<LayerT>::value) layer.head_dim = dim;
      else if (dim < 1) return absent("LayerConfig", "head_dim", "CFG-SHAPE", "it must still be >= 1");
      c.layers.push_back(layer);
    }
    return true;
  }

  Response dispatch(const std::string& method, const Json& params) {
    Response bad;
    if (method == "hello") {
      if (!offers_our_version(params)) return Response::error("protocol", "", "this driver speaks protocol version 1 only");
      Json r = Json::obj();
      r.set("protocol", Json::of(kProtocolName));
      r.set("version", Json::of(kProtocolVersion));
      r.set("implementation", Json::of(name_));
      r.set("methods", methods());
      if constexpr (kCells) r.set("layout", Json::of("cell"));
      Json scope = Json::arr();
      for (const std::string& feature : features()) scope.push(Json::of(feature));
      r.set("scope", scope);
      return Response::result(r);
    }
    if (method == "bye") return Response::result(Json::null());
    if (method == "reset") { cache_.reset(); return Response::result(Json::null()); }
    if (method == "create") {
      cache_.reset();
      const Json* config = params.get("config");
      Config c{};
      std::string rule, why;
      if (!config || !config_from(*config, c, rule, why)) return Response::error("rejected", rule, why);
      if constexpr (kCells) {
        int max_seqs = 64;
        if (const Json* m = config->get("max_seqs"); m && !to_int(*m, max_seqs, rule))
          return Response::error("rejected", rule, "max_seqs is not a C++ int");
        if (scope_.max_seqs && max_seqs != *scope_.max_seqs)  // SCOPE-BORDER: never reaches the cache
          return Response::error("rejected", max_seqs < 1 || max_seqs > 64 ? "CELL-MAX-SEQS" : "SCOPE-BORDER",
                                 "max_seqs " + std::to_string(max_seqs) + " is outside this cache's scope (max_seqs=" +
                                     std::to_string(*scope_.max_seqs) + ")");
        if (max_seqs_ignored_ && !scope_.max_seqs)
          return Response::error("rejected", "CELL-MAX-SEQS",
                                 "this cell cache is constructed from the config alone, so max_seqs cannot reach it: "
                                 "declare the one it serves (Scope::fixed_max_seqs) or pass a factory (config, max_seqs)");
        if (!factory_) return Response::error("rejected", "", "no factory: the cache has no constructor the driver can call");
        cache_ = factory_(c, max_seqs);
      } else {
        if (!factory_) return Response::error("rejected", "", "no factory: the cache has no constructor the driver can call");
        cache_ = factory_(c);
      }
      if (!cache_) return Response::error("rejected", "", "the factory returned no cache");
      return Response::result(Json::null());
    }
    if (!supports(method)) return Response::error("unsupported", "", method + " is not implemented");
    if (!cache_) return Response::error("protocol", "", "no cache: send create first");
    if constexpr (kCells) return cell_dispatch(method, params);
    else return sequence_dispatch(method, params);
  }

  // The cell layout's methods (spec/PROTOCOL.md, "Cell methods").
  Response cell_dispatch(const std::string& method, const Json& params) {
    Cache& cache = *cache_;
    Response bad;
    auto optional_int = [&](const char* name, std::optional<int>& out) {
      const Json* v = params.get(name);
      if (!v || v->is(Json::Type::Null)) { out = std::nullopt; return true; }
      int value = 0;
      std::string rule;
      if (!to_int(*v, value, rule)) { bad = Response::error("rejected", rule, std::string(name) + " is not a C++ int"); return false; }
      out = value;
      return true;
    };
    auto int_list = [&](const char* name, std::vector<int32_t>& out) {
      const Json* v = params.get(name);
      if (!v || !v->is(Json::Type::Array)) { bad = Response::error("rejected", "ARG-TYPE", std::string(name) + " is not an array"); return false; }
      for (const Json& item : v->array) {
        int value = 0;
        std::string rule;
        if (!to_int(item, value, rule)) { bad = Response::error("rejected", rule, std::string(name) + " holds a non-int"); return false; }
        out.push_back(value);
      }
      return true;
    };
    auto id_or_null = [](const auto& id) { return id ? Json::of(static_cast<long long>(*id)) : Json::null(); };
    if (method == "declare_step") {
      std::vector<int32_t> ids;
      if (!int_list("seq_ids", ids)) return bad;
      return Response::result(Json::of(static_cast<bool>(cache.declare_step(ids))));
    }
    if (method == "place_step") {
      int layer = 0;
      std::vector<int32_t> positions;
      if (!ints(params, {{"layer", &layer}}, bad) || !int_list("positions", positions)) return bad;
      const auto* step = cache.place_step(layer, positions.data(), static_cast<int>(positions.size()));
      if (!step) return Response::result(Json::null());
      Json j = Json::obj(), cells = Json::arr(), bits = Json::arr();
      for (int i = 0; i < step->length; ++i) cells.push(Json::of(static_cast<long long>(step->cells[i])));
      for (long long k = 0; k < static_cast<long long>(step->length) * step->read_len; ++k)
        bits.push(Json::of(static_cast<long long>(step->mask_bits[k])));
      j.set("length", Json::of(static_cast<long long>(step->length)));
      j.set("read_len", Json::of(static_cast<long long>(step->read_len)));
      j.set("cells", cells);
      j.set("mask_bits", bits);
      return Response::result(j);
    }
    if (method == "seq_new") return Response::result(id_or_null(cache.seq_new()));
    if (method == "seq_clone" || method == "seq_rm" || method == "seq_len" || method == "next_pos") {
      int id = 0, p0 = 0;
      std::optional<int> cut;
      bool clone = method == "seq_clone", rm = method == "seq_rm";
      if (!ints(params, {{clone ? "src" : "seq_id", &id}}, bad)) return bad;
      if (rm && !ints(params, {{"p0", &p0}}, bad)) return bad;
      if ((clone || rm) && !optional_int(clone ? "upto" : "p1", cut)) return bad;
      if (clone) return Response::result(id_or_null(cache.seq_clone(id, cut)));
      if (rm) return Response::result(Json::of(static_cast<bool>(cache.seq_rm(id, p0, cut))));
      long long n = method == "seq_len" ? cache.seq_len(id) : cache.next_pos(id);
      return Response::result(Json::of(n));
    }
    if (method == "free_cells") return Response::result(Json::of(static_cast<long long>(cache.free_cells())));
    if (method == "used_end") return Response::result(Json::of(static_cast<long long>(cache.used_end())));
    if (method == "live") {  // only when live() is public (supports): otherwise answered "unsupported"
      Json ids = Json::arr();
      if constexpr (has_live<Cache>::value) {
        for (int32_t s = 0; s < 64; ++s)
          if (cache.live(s)) ids.push(Json::of(static_cast<long long>(s)));
      }
      return Response::result(ids);
    }
    if (method == "faces") {
      bool same = true;
      if constexpr (has_cell_faces<Cache>::value)
        same = is_this_object(cache, cache.as_batch_control()) && is_this_object(cache, cache.as_cell_stepper());
      Json r = Json::obj();
      r.set("same_object", Json::of(same));
      return Response::result(r);
    }
    if (method == "can_extend") {
      int n = 0;
      if (!ints(params, {{"n", &n}}, bad)) return bad;
      return Response::result(Json::of(static_cast<bool>(cache.can_extend(n))));
    }
    if (method == "capacity") return Response::result(Json::of(static_cast<long long>(cache.capacity())));
    if (method == "clear") { cache.clear(); return Response::result(Json::null()); }
    return Response::error("protocol", "", "unknown method " + method);
  }

  // The sequence layout's methods (spec/PROTOCOL.md, "Methods").
  Response sequence_dispatch(const std::string& method, const Json& params) {
    Response bad;
    Cache& cache = *cache_;
    if (method == "plan") {
      int layer = 0, position = 0, T = 0;
      if (!ints(params, {{"layer", &layer}, {"position", &position}, {"T", &T}}, bad)) return bad;
      auto p = cache.plan(layer, position, T);
      return Response::result(p ? plan_json(*p) : Json::null());
    }
    if (method == "commit") {
      const Json* j = params.get("plan");
      PlanT p{};
      std::string rule, why;
      if (!j || !plan_from(*j, p, rule, why)) return Response::error("rejected", rule, why);
      if constexpr (std::is_same_v<decltype(cache.commit(p)), void>) {
        cache.commit(p);
      } else {
        if (!cache.commit(p)) return Response::error("rejected", "COMMIT-ISSUED", "commit returned false");
      }
      return Response::result(Json::null());
    }
    if (method == "can_extend") {
      int n = 0;
      if (!ints(params, {{"n", &n}}, bad)) return bad;
      return Response::result(Json::of(static_cast<bool>(cache.can_extend(n))));
    }
    if (method == "capacity") return Response::result(Json::of(static_cast<long long>(cache.capacity())));
    if (method == "rewind") {
      int new_len = 0;
      if (!ints(params, {{"new_len", &new_len}}, bad)) return bad;
      return Response::result(Json::of(static_cast<bool>(cache.rewind(new_len))));
    }
    if (method == "clear") { cache.clear(); return Response::result(Json::null()); }
    if (method == "faces") {
      bool same = true;
      if constexpr (has_faces<Cache>::value) {
        same = is_this_object(cache, cache.as_control()) && is_this_object(cache, cache.as_planner());
      }
      Json r = Json::obj();
      r.set("same_object", Json::of(same));
      return Response::result(r);
    }
    if (method == "length") {
      if constexpr (has_length<Cache>::value) return Response::result(Json::of(static_cast<long long>(cache.length())));
    }
    if (method == "depth" || method == "retained_from") {
      int layer = 0;
      if (!ints(params, {{"layer", &layer}}, bad)) return bad;
      if (method == "depth") {
        if constexpr (has_depth<Cache>::value) return Response::result(Json::of(static_cast<long long>(cache.depth(layer))));
      } else {
        if constexpr (has_retained_from<Cache>::value)
          return Response::result(Json::of(static_cast<long long>(cache.retained_from(layer))));
      }
    }
    return Response::error("protocol", "", "unknown method " + method);
  }

  std::string replay_test(const Json* config, const Json& test, int& skipped) {
    if (config && !config->is(Json::Type::Null)) {
      Json params = Json::obj();
      params.set("config", *config);
      Response created = handle("create", params);
      if (!created.ok) return "create refused the group's config: " + created.message;
    }
    const Json* calls = test.get("calls");
    for (size_t k = 0; k < calls->array.size(); ++k) {
      const Json& call = calls->array[k];
      const std::string& method = call.get("method")->string;
      const Json& params = *call.get("params");
      const Json& expect = *call.get("expect");
      if (!supports(method)) { ++skipped; continue; }
      Response got = handle(method, params);
      std::string where = "call " + std::to_string(k) + " " + method + dump(params) + ": ";
      if (const Json* result = expect.get("result")) {
        if (!got.ok) return where + "expected " + dump(*result) + ", got error " + got.message;
        if (dump(got.value) != dump(*result)) return where + "expected " + dump(*result) + ", got " + dump(got.value);
        continue;
      }
      bool served = got.ok && !got.value.is(Json::Type::Null) &&
                    !(got.value.is(Json::Type::Bool) && !got.value.boolean);
      if (method == "create" && got.ok) return where + "an invalid config was accepted (" + dump(expect) + ")";
      if (served && method != "commit" && method != "clear" && method != "create")
        return where + "must not be served (" + dump(expect) + "), got " + dump(got.value);
    }
    return "";
  }
};

// Serve the protocol on stdin/stdout, or `--vectors FILE` to replay golden vectors or a saved finding.
// `scope`: the layer kinds the cache implements (default: flat and ring).
template <class Cache, class Config>
int run_main(int argc, char** argv, const char* name, Scope scope,
             typename Driver<Cache, Config>::Factory factory = nullptr) {
  Driver<Cache, Config> driver(name, std::move(factory), std::move(scope));
  if (argc >= 3 && std::string(argv[1]) == "--vectors") return driver.replay_vectors(argv[2], std::cout, std::cerr);
  if (argc >= 2) {
    std::cerr << "usage: " << argv[0] << " [--vectors FILE]\n";
    return 2;
  }
  std::ios::sync_with_stdio(false);
  return driver.serve(std::cin, std::cout);
}

template <class Cache, class Config>
int run_main(int argc, char** argv, const char* name, typename Driver<Cache, Config>::Factory factory = nullptr) {
  return run_main<Cache, Config>(argc, argv, name, Scope::full(), std::move(factory));
}


// --- the op face: a C++ `update_and_fetch` cache (spec/PROTOCOL.md, "Op-face targets") ---------------
//
// What run_main is for the plan faces, op::run_main is for a contiguous op-face cache (one sequence,
// `update_and_fetch(layer, k, v, position)` answering K/V history and an AttendSpec): one call, a
// factory from the op config, and a fetch that converts tensors to the cache's own type and back.
//
//     namespace op = kvcache_conformance::op;
//     return op::run_main<MyCache>(argc, argv, "my op cache", op::Scope::full().without("batch"),
//         [](const op::Config& c) { return std::make_unique<MyCache>(...); },
//         [](MyCache& cache, int layer, const op::Tensor& k, const op::Tensor& v, const op::Tensor& position) {
//           auto answer = cache.update_and_fetch(layer, op::int32s(position), to_mine(k), to_mine(v));
//           return op::Fetched{op::Tensor::of("float32", ...), ..., op::Mask::Explicit, mask};
//         });
//
// The cache needs `reset()`, and `used(int layer)` unless it keeps no length of its own (the caller passes
// positions): without it the hello announces `no-length` and the harness judges the cache by its answers.
// A cache with the trim verb (OP-TRIM, spec 2: op::Scope::full(2)) passes a fifth callable,
// `[](MyCache& cache, int n) { cache.trim(n); }`: without it the hello leaves `trim` out of the scope whatever
// `scope` says. op::Scope::full() is spec 1's whole face, as before trim and sinks existed; relaxations are
// announced with `.with(...)` (op::Scope::full(2).with("trusted-args").with("lossy=0.25")).
// Tensors cross exactly: elements are doubles here, which hold every float32 and every label the harness
// sends. The driver refuses by itself only what a C++ signature cannot receive (a layer id that is not
// an int, a config field that is not one: OP-ARGS / OP-CONFIG) and the configurations outside the
// declared scope (SCOPE-BORDER: batch_size > 1 without `batch`, max_write set without `max_write`,
// v_head_dim != head_dim without `mla`, a keep > 0 without `sinks`, a layer kind left out) before the
// factory runs; everything else
// reaches the cache. A std::exception from the factory or the fetch is a rejection; its rule is the
// message's leading "RULE-ID:" when it has one. A crash (a signal, an exit) is the harness's to report:
// it restarts the target and goes on. The op face has no golden vectors, so there is no --vectors mode.
namespace op {

// A tensor as it crosses the protocol: {"dtype", "shape", "data"}, elements flat in row-major order.
struct Tensor {
  std::string dtype;  // "float32", "int64", "bool" (answers may also use float16/float64/int32)
  std::vector<long long> shape;
  std::vector<double> data;

  long long dim(size_t axis) const { return axis < shape.size() ? shape[axis] : -1; }
  template <class Shape, class Data>
  static Tensor of(std::string dtype, const Shape& shape, const Data& data) {
    Tensor t;
    t.dtype = std::move(dtype);
    for (auto d : shape) t.shape.push_back(static_cast<long long>(d));
    for (auto x : data) t.data.push_back(static_cast<double>(x));
    return t;
  }
};

enum class Mask { None, Causal, Explicit };   // AttendSpec kinds; Causal is torch's, upper-left (OP-MASK)

// An update_and_fetch answer: the K/V history [B, Hkv, rows, D|Dv] and the AttendSpec (`mask`, a bool
// [q_len, rows] tensor, or [B, q_len, rows] - one per batch row, OP-PAD - only for Explicit).
struct Fetched {
  Tensor k_hist, v_hist;
  Mask kind = Mask::Explicit;
  Tensor mask;

  // A lower-right causal over the history (MLX's "causal": query i of q_len attends rows up to
  // rows - q_len + i) as this protocol's AttendSpec: CAUSAL when q_len == rows, where upper-left and
  // lower-right agree, else the EXPLICIT mask it means.
  static Fetched lower_right_causal(Tensor k_hist, Tensor v_hist, long long q_len) {
    const long long rows = k_hist.dim(2);
    Fetched f{std::move(k_hist), std::move(v_hist), Mask::Causal, {}};
    if (q_len == rows) return f;
    std::vector<bool> bits;
    for (long long i = 0; i < q_len; ++i)
      for (long long r = 0; r < rows; ++r) bits.push_back(r <= rows - q_len + i);
    f.kind = Mask::Explicit;
    f.mask = Tensor::of("bool", std::vector<long long>{q_len, rows}, bits);
    return f;
  }
};

// A layer policy as the config says it (not checked here: the cache validates it, OP-CONFIG).
struct Policy {
  std::string kind;  // "flat" or "ring"
  int window = 0;
  int keep = 0;      // a ring's attention sinks (OP-SINKS): 0 when the config says none
};

// The op config (spec/PROTOCOL.md, "Op-face targets"), every field as sent: the cache validates it.
struct Config {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0, v_head_dim = 0, batch_size = 0, capacity = 0;
  std::string sizing = "dynamic";   // "dynamic" or "static"
  std::vector<Policy> layers;       // one policy for every layer, or one per layer
  std::optional<int> max_write;     // empty: no bound per step; set: OP-MAX-WRITE
};

// The positions of a [q_len, 1] position tensor as int32 (the MLX op handler's type), in order; every
// element of any other shape too, so a cache that checks one position per token sees the mismatch.
inline std::vector<int32_t> int32s(const Tensor& position) {
  std::vector<int32_t> out;
  for (double p : position.data) {
    if (!(p >= INT32_MIN && p <= INT32_MAX)) throw std::out_of_range("OP-POS: a position that int32 cannot hold");
    out.push_back(static_cast<int32_t>(p));
  }
  return out;
}

// A state's bytes (OP-STATE) cross the protocol as standard base64 (spec/PROTOCOL.md, "Op-face targets"); a
// cache's state is a std::string of bytes in its own format.
inline std::string base64_encode(const std::string& bytes) {
  static const char* letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);   // the bytes of this group: 4 letters, '=' for each missing
    unsigned long chunk = 0;
    for (size_t j = 0; j < 3; ++j) chunk = (chunk << 8) | (j < n ? static_cast<unsigned char>(bytes[i + j]) : 0u);
    for (size_t j = 0; j < 4; ++j) out.push_back(j <= n ? letters[(chunk >> (18 - 6 * j)) & 63] : '=');
  }
  return out;
}

// The bytes of a standard base64 string (padded, nothing else), else std::invalid_argument.
inline std::string base64_decode(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  if (text.size() % 4 != 0) throw std::invalid_argument("a state is standard base64: its length a multiple of 4");
  std::string out;
  for (size_t i = 0; i < text.size(); i += 4) {
    unsigned long chunk = 0;
    int padding = 0;
    for (size_t j = 0; j < 4; ++j) {
      const char c = text[i + j];
      const bool last = i + 4 == text.size();
      if (c == '=' && last && j >= 2 && (j == 3 || text[i + 3] == '=')) { ++padding; chunk <<= 6; continue; }
      const int v = value(c);
      if (v < 0 || padding) throw std::invalid_argument("a state is standard base64: a character outside it");
      chunk = (chunk << 6) | static_cast<unsigned long>(v);
    }
    for (int j = 0; j < 3 - padding; ++j) out.push_back(static_cast<char>((chunk >> (16 - 8 * j)) & 255));
  }
  return out;
}

// The op face's scope (spec/SPEC.md section 6.1, SCOPE-BORDER): the features the cache implements, the spec
// version it was written against, and the relaxations it declares. full() is the whole contiguous face of spec 1,
// the meaning it had before trim and sinks existed (a cache written then keeps its verdict); full(2) is spec 2's,
// which adds `trim` and `sinks` (spec/conformance/scope.py, SPEC_VERSIONS). A feature of a later version than the
// declared one is never sent: a spec-1 cache never sees a `keep`. Relaxations (owing less than the spec) are
// announced as the hello spells them: `.with("trusted-args")`, `.with("lossy=0.25")`, `.with("user-config=window")`.
struct Scope {
  std::vector<std::string> features;
  int spec = 1;                            // the spec version announced (spec=N in hello when above 1)
  std::vector<std::string> relaxations;    // trusted-args, unbounded, lazy-shapes, lossy=, min_head_dim=, user-config=
  static Scope full() {
    Scope whole;
    whole.features = {"flat", "ring", "max_write", "batch", "mla", "positions", "steps"};
    return whole;
  }
  // full(3) adds `state` (OP-STATE; spec 3's `chunk` and `recording` the Config does not carry, so full(3) and
  // full(4) leave them out and the driver refuses such configs at the border); full(4) adds `pad`, `batch-verbs`
  // and `quantize` (OP-PAD, OP-ROWS, OP-QUANTIZE); full(5) adds `merge` (OP-ROWS' extend and extract). A driver given
  // no callable for a verb drops its feature from the hello.
  static Scope full(int spec_version) {
    if (spec_version < 1 || spec_version > 5) throw std::invalid_argument("op::Scope::full: spec versions are 1 to 5");
    Scope whole = full();
    if (spec_version >= 2) whole.features.insert(whole.features.end(), {"trim", "sinks"});
    if (spec_version >= 3) whole.features.push_back("state");
    if (spec_version >= 4) whole.features.insert(whole.features.end(), {"pad", "batch-verbs", "quantize"});
    if (spec_version >= 5) whole.features.push_back("merge");
    whole.spec = spec_version;
    return whole;
  }
  Scope without(const std::string& feature) const {
    Scope left = *this;
    left.features.clear();
    for (const std::string& f : features)
      if (f != feature) left.features.push_back(f);
    return left;
  }
  // A feature of a later spec version (`state`: OP-STATE, spec 3), the version announced raised to it.
  Scope with_feature(const std::string& feature, int version) const {
    Scope more = *this;
    more.features.push_back(feature);
    more.spec = std::max(more.spec, version);
    return more;
  }
  Scope with(const std::string& relaxation) const {
    Scope more = *this;
    more.relaxations.push_back(relaxation);
    return more;
  }
  bool relaxes(const std::string& relaxation) const {
    return std::find(relaxations.begin(), relaxations.end(), relaxation) != relaxations.end();
  }
  // What the hello's "scope" lists: the features, the relaxations, and the version when it is above 1.
  std::vector<std::string> announced() const {
    std::vector<std::string> items = features;
    items.insert(items.end(), relaxations.begin(), relaxations.end());
    if (spec > 1) items.push_back("spec=" + std::to_string(spec));
    return items;
  }
  bool has(const std::string& feature) const {
    return std::find(features.begin(), features.end(), feature) != features.end();
  }
};

// The rule id an exception names: its message's leading "RULE-ID:" (capitals, digits, dashes), or "".
inline std::string rule_of(const std::string& what) {
  size_t n = what.find(':');
  if (n == std::string::npos || n == 0) return "";
  for (size_t i = 0; i < n; ++i)
    if (!(std::isupper(static_cast<unsigned char>(what[i])) || std::isdigit(static_cast<unsigned char>(what[i])) ||
          what[i] == '-'))
      return "";
  return what.substr(0, n);
}

template <class C, class = void> struct has_used : std::false_type {};
template <class C> struct has_used<C, std::void_t<decltype(static_cast<long long>(std::declval<C&>().used(0)))>>
    : std::true_type {};
template <class C, class = void> struct has_reset : std::false_type {};
template <class C> struct has_reset<C, std::void_t<decltype(std::declval<C&>().reset())>> : std::true_type {};

template <class Cache>
class Driver {
  static_assert(has_reset<Cache>::value, "an op-contiguous cache has reset() (spec/PROTOCOL.md, 'Op-face targets')");

 public:
  using Factory = std::function<std::unique_ptr<Cache>(const Config&)>;
  using Fetch = std::function<Fetched(Cache&, int, const Tensor&, const Tensor&, const Tensor&)>;
  using Trim = std::function<void(Cache&, int)>;   // optional: trim(n), OP-TRIM
  // optional: the batch verbs (OP-PAD, OP-ROWS): the verb ("pad", "select", "reorder", "repeat") and its ints (a
  // pad count or a row index each; repeat's one `times`)
  using Batch = std::function<void(Cache&, const std::string&, const std::vector<int>&)>;
  // optional (OP-STATE, the scope feature `state`): the cache's state as bytes, and a state loaded (an exception
  // refuses it, the cache unchanged)
  struct State {
    std::function<std::string(Cache&)> save;
    std::function<void(Cache&, const std::string&)> load;
  };
  // optional (OP-QUANTIZE, the scope feature `quantize`): quantize(bits) mid-generation (an exception refuses it,
  // the cache unchanged); a bits no C++ int holds (true, 2.0) is refused by the driver
  using Quantize = std::function<void(Cache&, int)>;
  // optional (OP-ROWS' extend and extract, the scope feature `merge`): extend(live, other) appends other's rows to
  // the live cache, other left as it is; extract(live, row) returns row `row` as a cache of its own, the live one
  // unchanged (an exception refuses either, nothing changed). The driver holds the side cache the harness's verbs
  // name (PROTOCOL.md: aside, swap, extend, extract); a row no C++ int holds (true, 0.0) is refused by the driver.
  struct Merge {
    std::function<void(Cache&, Cache&)> extend;
    std::function<std::unique_ptr<Cache>(Cache&, int)> extract;
  };

  Driver(std::string name, Scope scope, Factory factory, Fetch fetch, Trim trim = nullptr, Batch batch = nullptr,
         State state = {}, Quantize quantize = nullptr, Merge merge = {})
      : name_(std::move(name)), scope_(trimmed(batch ? std::move(scope) : scope.without("pad").without("batch-verbs"),
                                               trim != nullptr)),
        factory_(std::move(factory)), fetch_(std::move(fetch)), trim_(std::move(trim)), batch_(std::move(batch)),
        state_(std::move(state)), quantize_(std::move(quantize)), merge_(std::move(merge)) {
    if (!state_.save || !state_.load) scope_ = scope_.without("state");
    if (!quantize_) scope_ = scope_.without("quantize");
    if (!merge_.extend || !merge_.extract) scope_ = scope_.without("merge");
  }

  Response handle(const std::string& method, const Json& params) {
    try {
      return dispatch(method, params);
    } catch (const std::exception& e) {
      return Response::error("rejected", rule_of(e.what()), e.what());
    }
  }

  int serve(std::istream& in, std::ostream& out) {
    return serve_requests(in, out, [this](const std::string& method, const Json& params) {
      return handle(method, params);
    });
  }

 private:
  std::string name_;
  Scope scope_;
  Factory factory_;
  Fetch fetch_;
  Trim trim_;
  Batch batch_;
  State state_;
  Quantize quantize_;
  Merge merge_;
  std::unique_ptr<Cache> cache_;
  std::unique_ptr<Cache> side_;   // the side cache (feature `merge`): create replaces the live cache only

  static Scope trimmed(Scope scope, bool has_trim) { return has_trim ? scope : scope.without("trim"); }

  // OP-PAD, OP-ROWS: a batch verb's ints as the request carries them (a list for pad, select and reorder; one int
  // for repeat); a value no C++ int holds (true, 0.0) or no list has no C++ form: refused here, naming the rule.
  std::vector<int> batch_ints(const std::string& method, const Json& params) const {
    const char* rule = method == "pad" ? "OP-PAD" : "OP-ROWS";
    const char* name = method == "pad" ? "left_padding" : method == "repeat" ? "times" : "rows";
    const Json* value = params.get(name);
    std::vector<int> ints;
    if (method == "repeat") {
      std::optional<int> times = as_int(value);
      if (!times) throw std::invalid_argument(std::string(rule) + ": times is not a C++ int");
      return {*times};
    }
    if (!value || !value->is(Json::Type::Array)) throw std::invalid_argument(std::string(rule) + ": " + name + " is a list");
    for (const Json& item : value->array) {
      std::optional<int> i = as_int(&item);
      if (!i) throw std::invalid_argument(std::string(rule) + ": " + name + " holds a value that is not a C++ int");
      ints.push_back(*i);
    }
    return ints;
  }

  // The spec-3 feature a config carries that this driver's Config cannot (a chunk layer, record_past), or "".
  std::string uncarried(const Json& json) const {
    if (const Json* layers = json.get("layers"); layers && layers->is(Json::Type::Array))
      for (const Json& entry : layers->array) {
        const Json* kind = entry.get("kind");
        if (entry.get("chunk") || (kind && kind->is(Json::Type::String) && kind->string == "chunk")) return "chunk";
      }
    return json.get("record_past") ? "recording" : "";
  }

  // A JSON int a C++ int holds (a bool, a float, 2^31 are not), else nullopt.
  static std::optional<int> as_int(const Json* v) {
    if (!v || !v->is(Json::Type::Int) || v->big || v->integer < INT_MIN || v->integer > INT_MAX) return std::nullopt;
    return static_cast<int>(v->integer);
  }

  // A lazy-shapes cache (its sizes learnt from the first update) is sent no sizes: they read as 0 here.
  Config read_config(const Json& json) const {
    static const char* const sizes[] = {"n_kv_heads", "head_dim", "v_head_dim", "batch_size"};
    auto field = [&](const char* name, const Json* fallback = nullptr) {
      const Json* v = json.get(name);
      if (!v && !fallback && scope_.relaxes("lazy-shapes") &&
          std::any_of(std::begin(sizes), std::end(sizes), [&](const char* s) { return std::string(s) == name; }))
        return 0;
      std::optional<int> i = as_int(v ? v : fallback);
      if (!i) throw std::invalid_argument(std::string("OP-CONFIG: ") + name + " is not a C++ int");
      return *i;
    };
    Config c;
    c.n_layers = field("n_layers");
    c.n_kv_heads = field("n_kv_heads");
    c.head_dim = field("head_dim");
    c.v_head_dim = field("v_head_dim", json.get("head_dim"));
    c.batch_size = field("batch_size");
    c.capacity = field("capacity");
    if (const Json* sizing = json.get("sizing")) {
      if (!sizing->is(Json::Type::String)) throw std::invalid_argument("OP-CONFIG: sizing is a string");
      c.sizing = sizing->string;
    }
    if (const Json* m = json.get("max_write"); m && !m->is(Json::Type::Null)) c.max_write = field("max_write");
    const Json* layers = json.get("layers");
    if (!layers || !layers->is(Json::Type::Array)) throw std::invalid_argument("OP-CONFIG: layers is a list");
    for (const Json& entry : layers->array) {
      const Json* kind = entry.get("kind");
      std::optional<int> window = as_int(entry.get("window"));
      const Json* keep_json = entry.get("keep");
      std::optional<int> keep = keep_json ? as_int(keep_json) : std::optional<int>(0);
      if (!kind || !kind->is(Json::Type::String) || !window || !keep)
        throw std::invalid_argument("OP-CONFIG: a layer policy is {kind, window, keep}, ints");
      c.layers.push_back(Policy{kind->string, *window, *keep});
    }
    return c;
  }

  // The scope feature a config needs that the declared scope leaves out ("" when it is inside).
  std::string outside(const Config& c) const {
    for (const Policy& p : c.layers)
      if ((p.kind == "flat" || p.kind == "ring") && !scope_.has(p.kind)) return p.kind;
    const bool sized = !scope_.relaxes("lazy-shapes");   // a lazy-shapes cache is sent no sizes to tell by
    if (sized && c.batch_size != 1 && !scope_.has("batch")) return "batch";
    if (c.max_write && !scope_.has("max_write")) return "max_write";
    if (sized && c.v_head_dim != c.head_dim && !scope_.has("mla")) return "mla";
    for (const Policy& p : c.layers)
      if (p.keep != 0 && !scope_.has("sinks")) return "sinks";
    return "";
  }

  static Tensor read_tensor(const Json* j, const char* name) {
    auto malformed = [&](const char* why) {
      return std::invalid_argument(std::string("a malformed tensor ") + name + ": " + why);
    };
    const Json* dtype = j ? j->get("dtype") : nullptr;
    const Json* shape = j ? j->get("shape") : nullptr;
    const Json* data = j ? j->get("data") : nullptr;
    if (!dtype || !dtype->is(Json::Type::String) || !shape || !shape->is(Json::Type::Array) || !data ||
        !data->is(Json::Type::Array))
      throw malformed("not {dtype, shape, data}");
    Tensor t;
    t.dtype = dtype->string;
    long long count = 1;
    for (const Json& d : shape->array) {
      if (!d.is(Json::Type::Int) || d.big || d.integer < 0 || d.integer > (1LL << 31)) throw malformed("a bad shape");
      t.shape.push_back(d.integer);
      count *= d.integer;
      if (count > (1LL << 31)) throw malformed("too many elements");
    }
    if (static_cast<long long>(data->array.size()) != count) throw malformed("data does not fill its shape");
    for (const Json& x : data->array) {
      if (t.dtype == "bool" && x.is(Json::Type::Bool)) t.data.push_back(x.boolean ? 1 : 0);
      else if (t.dtype != "bool" && x.is(Json::Type::Int) && !x.big) t.data.push_back(static_cast<double>(x.integer));
      else if (t.dtype != "bool" && t.dtype.rfind("float", 0) == 0 && x.is(Json::Type::Double)) t.data.push_back(x.number);
      else throw malformed("an element that is not of its dtype");
    }
    return t;
  }

  static Json tensor_json(const Tensor& t) {
    Json j = Json::obj(), shape = Json::arr(), data = Json::arr();
    for (long long d : t.shape) shape.push(Json::of(d));
    for (double x : t.data) {
      if (t.dtype == "bool") {
        data.push(Json::of(x != 0));
      } else if (t.dtype.rfind("int", 0) == 0) {
        data.push(Json::of(static_cast<long long>(x)));
      } else {
        Json number;
        number.type = Json::Type::Double;
        number.number = x;
        data.push(number);
      }
    }
    j.set("dtype", Json::of(t.dtype));
    j.set("shape", shape);
    j.set("data", data);
    return j;
  }

  static Json answer_json(const Fetched& f) {
    static const char* const kinds[] = {"NONE", "CAUSAL", "EXPLICIT"};
    Json attend = Json::obj();
    attend.set("kind", Json::of(kinds[static_cast<int>(f.kind)]));
    attend.set("mask", f.kind == Mask::Explicit ? tensor_json(f.mask) : Json::null());
    Json answer = Json::obj();
    answer.set("k_hist", tensor_json(f.k_hist));
    answer.set("v_hist", tensor_json(f.v_hist));
    answer.set("attend", attend);
    return answer;
  }

  Response used(const Json& params) {
    if constexpr (has_used<Cache>::value) {
      return Response::result(Json::of(static_cast<long long>(cache_->used(layer_id(params)))));
    } else {
      return Response::error("unsupported", "", "this cache keeps no length of its own (no-length)");
    }
  }

  int layer_id(const Json& params) const {
    std::optional<int> layer = as_int(params.get("layer_id"));
    if (!layer) throw std::invalid_argument("OP-ARGS: layer_id is not a C++ int");   // true is not 1
    return *layer;
  }

  Response dispatch(const std::string& method, const Json& params) {
    if (method == "hello") {
      if (!offers_our_version(params)) return Response::error("protocol", "", "this driver speaks protocol version 1 only");
      Json r = Json::obj(), scope = Json::arr();
      for (const std::string& item : scope_.announced()) scope.push(Json::of(item));
      // a cache without used(layer) keeps no length of its own: it says so (no-length), and is judged by its answers
      if (!has_used<Cache>::value && !scope_.relaxes("no-length")) scope.push(Json::of("no-length"));
      r.set("protocol", Json::of(kProtocolName));
      r.set("version", Json::of(kProtocolVersion));
      r.set("implementation", Json::of(name_));
      r.set("methods", Json::arr());
      r.set("layout", Json::of("op-contiguous"));
      r.set("scope", scope);
      return Response::result(r);
    }
    if (method == "bye") return Response::result(Json::null());
    if (method == "create") {
      cache_.reset();
      const Json* json = params.get("config");
      if (!json || !json->is(Json::Type::Object)) return Response::error("rejected", "OP-CONFIG", "config is an object");
      if (std::string feature = uncarried(*json); !feature.empty())
        return Response::error("rejected", "SCOPE-BORDER", "the config needs '" + feature + "', which this driver does "
                                                           "not carry");
      Config c = read_config(*json);
      if (std::string feature = outside(c); !feature.empty())
        return Response::error("rejected", "SCOPE-BORDER", "the config needs '" + feature + "', outside this cache's scope");
      cache_ = factory_(c);
      if (!cache_) return Response::error("rejected", "", "the factory built no cache");
      return Response::result(Json::null());
    }
    if (method == "aside" || method == "swap") {   // the side cache's verbs that need no live cache
      if (!merge_.extend || !merge_.extract) return Response::error("unsupported", "", method + " is not implemented");
      if (method == "aside") side_ = std::move(cache_);
      else std::swap(cache_, side_);
      return Response::result(Json::null());
    }
    if (!cache_) return Response::error("protocol", "", "no cache: send create first");
    if (method == "extend" || method == "extract") {   // OP-ROWS on the side cache
      if (!merge_.extend || !merge_.extract) return Response::error("unsupported", "", method + " is not implemented");
      if (method == "extend") {
        if (!side_) throw std::invalid_argument("OP-ROWS: extend: no side cache to append");
        merge_.extend(*cache_, *side_);
        return Response::result(Json::null());
      }
      std::optional<int> row = as_int(params.get("row"));
      if (!row) throw std::invalid_argument("OP-ROWS: row is not a C++ int");   // true, 0.0: none to hand over
      std::unique_ptr<Cache> out = merge_.extract(*cache_, *row);
      if (!out) throw std::invalid_argument("OP-ROWS: extract built no cache");
      side_ = std::move(out);
      return Response::result(Json::null());
    }
    if (method == "update_and_fetch") {
      int layer = layer_id(params);
      Tensor k, v, position;
      try {
        k = read_tensor(params.get("k"), "k");
        v = read_tensor(params.get("v"), "v");
        position = read_tensor(params.get("position"), "position");
      } catch (const std::invalid_argument& e) {
        return Response::error("protocol", "", e.what());   // the harness sends well-formed tensors only
      }
      // A C++ cache takes typed arrays: K and V floating-point of 4 dimensions, position integer of 2. A tensor
      // of another dtype or rank has no C++ form to hand over, so the driver refuses it, as a typed API would.
      if (k.dtype.rfind("float", 0) != 0 || v.dtype.rfind("float", 0) != 0 || position.dtype.rfind("int", 0) != 0 ||
          k.shape.size() != 4 || v.shape.size() != 4 || position.shape.size() != 2)
        throw std::invalid_argument("OP-ARGS: k and v are floating-point tensors of 4 dimensions, position an "
                                    "integer tensor of 2");
      return Response::result(answer_json(fetch_(*cache_, layer, k, v, position)));
    }
    if (method == "used") return used(params);
    if (method == "reset") { cache_->reset(); return Response::result(Json::null()); }
    if (method == "trim") {
      if (!trim_) return Response::error("unsupported", "", "trim is not implemented");
      std::optional<int> n = as_int(params.get("n"));
      if (!n) throw std::invalid_argument("OP-TRIM: n is not a C++ int");   // true, 0.0: no C++ int to hand over
      trim_(*cache_, *n);
      return Response::result(Json::null());
    }
    if (method == "pad" || method == "select" || method == "reorder" || method == "repeat") {
      if (!batch_) return Response::error("unsupported", "", method + " is not implemented");
      batch_(*cache_, method, batch_ints(method, params));
      return Response::result(Json::null());
    }
    if (method == "quantize") {   // OP-QUANTIZE
      if (!quantize_) return Response::error("unsupported", "", "quantize is not implemented");
      std::optional<int> bits = as_int(params.get("bits"));
      if (!bits) throw std::invalid_argument("OP-QUANTIZE: bits is not a C++ int");   // true, 2.0: none to hand over
      quantize_(*cache_, *bits);
      return Response::result(Json::null());
    }
    if (method == "state" || method == "load_state") {   // OP-STATE: bytes as base64 both ways
      if (!state_.save || !state_.load) return Response::error("unsupported", "", method + " is not implemented");
      if (method == "state") return Response::result(Json::of(base64_encode(state_.save(*cache_))));
      const Json* data = params.get("data");
      if (!data || !data->is(Json::Type::String)) return Response::error("protocol", "", "data is a base64 string");
      std::string bytes;
      try {
        bytes = base64_decode(data->string);
      } catch (const std::invalid_argument& e) {
        return Response::error("protocol", "", e.what());   // the harness sends standard base64 only
      }
      state_.load(*cache_, bytes);
      return Response::result(Json::null());
    }
    return Response::error("protocol", "", "unknown method " + method);
  }
};

// Serve the op protocol on stdin/stdout. `scope`: the op features the cache implements.
template <class Cache>
int run_main(int argc, char** argv, const char* name, Scope scope, typename Driver<Cache>::Factory factory,
             typename Driver<Cache>::Fetch fetch, typename Driver<Cache>::Trim trim = nullptr,
             typename Driver<Cache>::Batch batch = nullptr, typename Driver<Cache>::State state = {},
             typename Driver<Cache>::Quantize quantize = nullptr, typename Driver<Cache>::Merge merge = {}) {
  if (argc >= 2) {
    const std::string arg = argv[1];
    const char* usage = " - an op-face cache served over spec/PROTOCOL.md on stdin/stdout.\n"
                        "usage: run it with no argument, as a cmd: target of the suite:\n"
                        "  kvcache conformance --target cmd:PROGRAM --strict\n"
                        "The op face has no golden vectors: there is no --vectors mode.\n";
    if (arg == "--help" || arg == "-h") {
      std::cout << name << usage;
      return 0;
    }
    std::cerr << argv[0] << ": unknown argument " << arg << " (the op face has no golden vectors; --vectors is "
              << "the plan faces'); run it with no argument as a cmd: target of `kvcache conformance`, "
              << "or --help\n";
    return 2;
  }
  Driver<Cache> driver(name, std::move(scope), std::move(factory), std::move(fetch), std::move(trim), std::move(batch),
                       std::move(state), std::move(quantize), std::move(merge));
  std::ios::sync_with_stdio(false);
  return driver.serve(std::cin, std::cout);
}

}  // namespace op


// --- the paged face: a C++ block pool with prefix caching (spec/PROTOCOL.md, "Paged targets") ----------
//
// A serving engine's KV bookkeeping (vLLM's KVCacheManager, SGLang's radix cache): a pool of blocks, one block
// table per request and KV group, prefix caching by full blocks. The harness acts as the model runner: it writes a
// fingerprint into every slot a reservation maps and reads the tables back, so the cache is judged by the data,
// never by its block ids. One call serves it (spec/cpp/example/serve_paged_cache.cpp is a whole target):
//
//     namespace paged = kvcache_conformance::paged;
//     int main(int argc, char** argv) { return paged::run_main<MyPagedCache>(argc, argv, "my paged cache"); }
//
// Requirements on the cache (duck-typed): constructible from `const paged::Config&` (or pass a factory
// std::unique_ptr<Cache>(const paged::Config&) after the name), throwing to refuse a config;
//   admit(const std::string& request, const Tokens& tokens, const std::vector<std::string>& keys, int budget)
//       -> std::optional<int>   (the prefix hit, or nullopt when the reservation does not fit now);
//   extend(const std::string& request, const Tokens& tokens, int budget) -> std::optional<int>   (the slots reserved);
//   free(const std::string& request); table(const std::string& request) -> std::vector<Table>; available() -> int;
//   optional: ref_counts() -> pairs of (block id, count), e.g. std::map<int, int> (announced in hello's methods).
// A std::exception is a rejection (a malformed call); its rule is the message's leading "RULE-ID:" when it has one.
// The driver refuses itself only what those signatures cannot receive (a request that is not a string, a token or a
// budget that is not a C++ int, a key that is not a string; a config field that is not a C++ int, a prefix_caching
// that is not a bool, a key paged::Config has no field for); negatives, zero budgets, unknown requests reach the cache.
namespace paged {

using Tokens = std::vector<int>;   // token ids are ints in [0, INT_MAX] (PAGED-ARGS): a C++ int holds each
using Table = std::vector<std::optional<int>>;   // block index -> block id; nullopt where the group holds none

// A KV group as the config says it (not checked here: the cache validates it).
struct Group {
  std::string kind;            // "full" or "window"
  std::optional<int> window;   // empty when the config gives none (a full group)
};

// The paged config (spec/PROTOCOL.md, "Paged targets"), every field as sent: the cache validates it.
struct Config {
  int block_size = 0, num_blocks = 0, max_model_len = 0;
  std::vector<Group> groups;
  bool prefix_caching = false;
};

template <class C, class = void> struct has_ref_counts : std::false_type {};
template <class C> struct has_ref_counts<C, std::void_t<decltype(std::declval<C&>().ref_counts().begin())>>
    : std::true_type {};

template <class Cache>
class Driver {
 public:
  using Factory = std::function<std::unique_ptr<Cache>(const Config&)>;

  Driver(std::string name, Factory factory) : name_(std::move(name)), factory_(std::move(factory)) {
    if (!factory_) {
      if constexpr (std::is_constructible_v<Cache, const Config&>)
        factory_ = [](const Config& c) { return std::make_unique<Cache>(c); };
    }
  }

  Response handle(const std::string& method, const Json& params) {
    try {
      return dispatch(method, params);
    } catch (const std::exception& e) {
      return Response::error("rejected", op::rule_of(e.what()), e.what());
    }
  }

  int serve(std::istream& in, std::ostream& out) {
    return serve_requests(in, out, [this](const std::string& method, const Json& params) {
      return handle(method, params);
    });
  }

 private:
  std::string name_;
  Factory factory_;
  std::unique_ptr<Cache> cache_;

  // Each refusal names its argument and rule: PAGED-ARGS for a call's, PAGED-CONFIG for a config's.
  static int as_int(const Json* v, const std::string& what) {
    if (!v || !v->is(Json::Type::Int) || v->big || v->integer < INT_MIN || v->integer > INT_MAX)
      throw std::invalid_argument(what + " is not a C++ int");   // true is not 1; nor is 2^31
    return static_cast<int>(v->integer);
  }

  static std::string as_string(const Json* v, const std::string& what) {
    if (!v || !v->is(Json::Type::String)) throw std::invalid_argument(what + " is not a string");
    return v->string;
  }

  static std::string request(const Json& params) { return as_string(params.get("request"), "PAGED-ARGS: request"); }
  static int budget(const Json& params) { return as_int(params.get("budget"), "PAGED-ARGS: budget"); }

  static Tokens tokens(const Json& params) {
    const Json* list = params.get("tokens");
    if (!list || !list->is(Json::Type::Array)) throw std::invalid_argument("PAGED-ARGS: tokens is not an array");
    Tokens out;
    for (const Json& t : list->array) out.push_back(as_int(&t, "PAGED-ARGS: tokens: a token"));
    return out;
  }

  static std::vector<std::string> keys(const Json& params) {
    const Json* list = params.get("keys");
    if (!list || !list->is(Json::Type::Array)) throw std::invalid_argument("PAGED-ARGS: keys is not an array");
    std::vector<std::string> out;
    for (const Json& k : list->array) out.push_back(as_string(&k, "PAGED-ARGS: keys: a key"));
    return out;
  }

  // A key paged::Config has no field for cannot reach the cache: refused here, named (PAGED-CONFIG: exactly these).
  static void only(const Json& object, std::initializer_list<const char*> known, const std::string& what) {
    for (const auto& kv : object.object)
      if (std::none_of(known.begin(), known.end(), [&](const char* k) { return kv.first == k; }))
        throw std::invalid_argument("PAGED-CONFIG: " + what + " has no key '" + kv.first + "'");
  }

  static Config read_config(const Json& json) {
    only(json, {"block_size", "num_blocks", "max_model_len", "groups", "prefix_caching"}, "a config");
    Config c;
    c.block_size = as_int(json.get("block_size"), "PAGED-CONFIG: block_size");
    c.num_blocks = as_int(json.get("num_blocks"), "PAGED-CONFIG: num_blocks");
    c.max_model_len = as_int(json.get("max_model_len"), "PAGED-CONFIG: max_model_len");
    const Json* caching = json.get("prefix_caching");
    if (!caching || !caching->is(Json::Type::Bool))
      throw std::invalid_argument("PAGED-CONFIG: prefix_caching is not a boolean");
    c.prefix_caching = caching->boolean;
    const Json* groups = json.get("groups");
    if (!groups || !groups->is(Json::Type::Array)) throw std::invalid_argument("PAGED-CONFIG: groups is not an array");
    for (const Json& g : groups->array) {
      if (!g.is(Json::Type::Object)) throw std::invalid_argument("PAGED-CONFIG: a group is not an object");
      only(g, {"kind", "window"}, "a group");
      Group group{as_string(g.get("kind"), "PAGED-CONFIG: a group's kind"), std::nullopt};
      if (const Json* w = g.get("window")) group.window = as_int(w, "PAGED-CONFIG: a group's window");
      c.groups.push_back(group);
    }
    return c;
  }

  static Json count(const std::optional<int>& n) { return n ? Json::of(*n) : Json::null(); }

  Json tables(const std::string& request) {
    Json groups = Json::arr();
    for (const Table& table : cache_->table(request)) {
      Json ids = Json::arr();
      for (const std::optional<int>& id : table) ids.push(count(id));
      groups.push(ids);
    }
    return groups;
  }

  Response dispatch(const std::string& method, const Json& params) {
    if (method == "hello") {
      if (!offers_our_version(params)) return Response::error("protocol", "", "this driver speaks protocol version 1 only");
      Json r = Json::obj(), methods = Json::arr();
      if constexpr (has_ref_counts<Cache>::value) methods.push(Json::of("ref_counts"));
      r.set("protocol", Json::of(kProtocolName));
      r.set("version", Json::of(kProtocolVersion));
      r.set("implementation", Json::of(name_));
      r.set("methods", methods);
      r.set("layout", Json::of("paged"));
      return Response::result(r);
    }
    if (method == "bye") return Response::result(Json::null());
    if (method == "create" || method == "reset") cache_.reset();
    if (method == "reset") return Response::result(Json::null());
    if (method == "create") {
      const Json* json = params.get("config");
      if (!json || !json->is(Json::Type::Object)) return Response::error("rejected", "", "config is not an object");
      if (!factory_) return Response::error("rejected", "", "no factory, and the cache is not built from a paged::Config");
      cache_ = factory_(read_config(*json));
      if (!cache_) return Response::error("rejected", "", "the factory built no cache");
      return Response::result(Json::null());
    }
    if (!cache_) return Response::error("protocol", "", "no cache: send create first");
    if (method == "admit")
      return Response::result(count(cache_->admit(request(params), tokens(params), keys(params), budget(params))));
    if (method == "extend") return Response::result(count(cache_->extend(request(params), tokens(params), budget(params))));
    if (method == "free") {
      cache_->free(request(params));
      return Response::result(Json::null());
    }
    if (method == "table") return Response::result(tables(request(params)));
    if (method == "available") return Response::result(Json::of(static_cast<long long>(cache_->available())));
    if (method == "ref_counts") {
      if constexpr (has_ref_counts<Cache>::value) {
        Json counts = Json::obj();   // JSON keys are strings: each block id in decimal (distinct: no set() search)
        for (const auto& [id, n] : cache_->ref_counts())
          counts.object.emplace_back(std::to_string(id), Json::of(static_cast<long long>(n)));
        return Response::result(counts);
      } else {
        return Response::error("unsupported", "", "ref_counts is not implemented");
      }
    }
    return Response::error("protocol", "", "unknown method " + method);
  }
};

// Serve the paged protocol on stdin/stdout.
template <class Cache>
int run_main(int argc, char** argv, const char* name, typename Driver<Cache>::Factory factory = nullptr) {
  if (argc >= 2) {
    const std::string arg = argv[1];
    if (arg == "--help" || arg == "-h") {
      std::cout << name << " - a paged cache served over spec/PROTOCOL.md on stdin/stdout.\n"
                << "usage: run it with no argument, as a cmd: target of the suite:\n"
                << "  kvcache conformance --target cmd:PROGRAM --strict\n"
                << "The paged face has no golden vectors: there is no --vectors mode.\n";
      return 0;
    }
    std::cerr << argv[0] << ": unknown argument " << arg << " (the paged face has no golden vectors; --vectors is "
              << "the plan faces'); run it with no argument as a cmd: target of `kvcache conformance`, or --help\n";
    return 2;
  }
  Driver<Cache> driver(name, std::move(factory));
  std::ios::sync_with_stdio(false);
  return driver.serve(std::cin, std::cout);
}

}  // namespace paged
}  // namespace kvcache_conformance
