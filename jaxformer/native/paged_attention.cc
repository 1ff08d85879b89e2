// Paged attention for XLA:CPU, called through XLA's FFI (jaxformer.native builds and registers it).
//
// Each query of a row attends over its row's slots up to its position (a sliding window's last `window` of them),
// read block by block straight from a layer's pool [K, N, block_size, H]: no gathered copy of the rows (XLA:CPU
// materialises every gather before a matmul reads it, so its paged read moves each byte about three times). One
// work item is a query of a row's kv head: its G query heads' scores, a softmax, then the weighted values. Items
// are shared out over XLA's intra-op thread pool. float32 throughout; NaN in a key or value reaches the output, as
// on XLA.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Shapes {
  int64_t B, T, NQ, H, K, N, S, M, G;
};

// One query (row b, token t) of kv head g over its row's slots up to its position (the last `window` of them;
// window 0: all): out[G, H].
void AttendQuery(const Shapes& d, int64_t b, int64_t t, int64_t g, int32_t position, const float* q,
                 const float* keys, const float* values, const int32_t* table, const float* sinks, float scale,
                 float softcap, int32_t window, float* out, std::vector<float>& scores) {
  const int64_t G = d.G, H = d.H, S = d.S;
  const float* qg = q + ((b * d.T + t) * d.NQ + g * G) * H;
  float* og = out + ((b * d.T + t) * d.NQ + g * G) * H;
  std::fill(og, og + G * H, 0.f);
  const int64_t end = int64_t{position} + 1;  // (a padding query, position -1: zeros)
  if (end <= 0) return;
  const int64_t first = window > 0 ? std::max<int64_t>(0, end - window) : 0;
  const int64_t length = end - first;
  scores.resize(G * length);
  // slot `slot` of this row's kv head g in a pool: block table[slot / S], offset slot % S
  auto at = [&](const float* pool, int64_t slot) { return pool + ((g * d.N + table[slot / S]) * S + slot % S) * H; };
  for (int64_t slot = first; slot < end; ++slot) {
    const float* key = at(keys, slot);
    for (int64_t j = 0; j < G; ++j) {
      const float* query = qg + j * H;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t h = 0; h < H; ++h) dot += query[h] * key[h];
      dot *= scale;
      if (softcap > 0.f) dot = softcap * std::tanh(dot / softcap);
      scores[j * length + slot - first] = dot;
    }
  }
  for (int64_t j = 0; j < G; ++j) {
    float* row = scores.data() + j * length;
    // a sink (gpt-oss): one more logit in the softmax, of a key without a value
    const float sink = sinks != nullptr ? sinks[g * G + j] : -INFINITY;
    float top = sink;
    for (int64_t s = 0; s < length; ++s) top = std::max(top, row[s]);
    float total = sinks != nullptr ? std::exp(sink - top) : 0.f;
    for (int64_t s = 0; s < length; ++s) {
      row[s] = std::exp(row[s] - top);
      total += row[s];
    }
    const float inverse = 1.f / total;
    for (int64_t s = 0; s < length; ++s) row[s] *= inverse;
  }
  for (int64_t slot = first; slot < end; ++slot) {
    const float* value = at(values, slot);
    for (int64_t j = 0; j < G; ++j) {
      const float p = scores[j * length + slot - first];
      float* o = og + j * H;
#pragma omp simd
      for (int64_t h = 0; h < H; ++h) o[h] += p * value[h];
    }
  }
}

// One call's work, shared by the caller and the helpers it schedules. On the heap, held by each task: a helper
// that starts after every item is done (its pool busy elsewhere) finds none left and touches nothing else.
struct Work {
  Shapes d;
  const float *q, *keys, *values, *sinks;
  const int32_t *tables, *positions;
  float scale, softcap;
  int32_t window;
  float* out;
  int64_t items;  // (row, kv head, query) triples
  std::atomic<int64_t> next{0}, done{0};
  std::mutex mutex;
  std::condition_variable finished;

  void Run() {
    std::vector<float> scores;
    for (int64_t item; (item = next.fetch_add(1)) < items;) {
      const int64_t t = item % d.T, g = item / d.T % d.K, b = item / (d.T * d.K);
      AttendQuery(d, b, t, g, positions[b * d.T + t], q, keys, values, tables + b * d.M, sinks, scale, softcap,
                  window, out, scores);
      if (done.fetch_add(1) + 1 == items) {
        std::lock_guard<std::mutex> lock(mutex);
        finished.notify_all();
      }
    }
  }
};

ffi::Error PagedAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> keys,
                              ffi::Buffer<ffi::F32> values, ffi::Buffer<ffi::S32> tables,
                              ffi::Buffer<ffi::S32> positions, ffi::Buffer<ffi::F32> sinks, float scale,
                              float softcap, int32_t window, ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions(), kd = keys.dimensions(), vd = values.dimensions(), td = tables.dimensions();
  auto pd = positions.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || td.size() != 2 || pd.size() != 2 ||
      !std::equal(kd.begin(), kd.end(), vd.begin(), vd.end())) {
    return ffi::Error::InvalidArgument("paged attention: want q [B, T, NQ, H], pools [K, N, S, H], tables [B, M], "
                                       "positions [B, T]");
  }
  Shapes d{qd[0], qd[1], qd[2], qd[3], kd[0], kd[1], kd[2], td[1], 0};
  if (kd[3] != d.H || d.K == 0 || d.NQ % d.K != 0 || td[0] != d.B || pd[0] != d.B || pd[1] != d.T) {
    return ffi::Error::InvalidArgument("paged attention: query heads, kv heads, rows or queries do not match");
  }
  d.G = d.NQ / d.K;
  if (sinks.element_count() != 0 && sinks.element_count() != static_cast<size_t>(d.NQ)) {
    return ffi::Error::InvalidArgument("paged attention: want one sink a query head, or none");
  }
  // Out-of-range blocks or positions would read outside the pool: an error, not a crash.
  for (int64_t i = 0; i < d.B * d.M; ++i) {
    if (tables.typed_data()[i] < 0 || tables.typed_data()[i] >= d.N) {
      return ffi::Error::InvalidArgument("paged attention: a block table names a block outside the pool");
    }
  }
  for (int64_t i = 0; i < d.B * d.T; ++i) {
    if (positions.typed_data()[i] >= d.M * d.S) {
      return ffi::Error::InvalidArgument("paged attention: a query's position is past its row's blocks");
    }
  }
  const int64_t items = d.B * d.K * d.T;
  if (items == 0) return ffi::Error::Success();
  auto work = std::make_shared<Work>();
  work->d = d;
  work->q = q.typed_data();
  work->keys = keys.typed_data();
  work->values = values.typed_data();
  work->sinks = sinks.element_count() != 0 ? sinks.typed_data() : nullptr;
  work->tables = tables.typed_data();
  work->positions = positions.typed_data();
  work->scale = scale;
  work->softcap = softcap;
  work->window = window;
  work->out = out->typed_data();
  work->items = items;
  // The caller works too and waits until every item is done, not until every helper has run: a helper queued
  // behind other work never holds the call up (nor, were the caller one of the pool's threads, deadlocks it).
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), items - 1);
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work]() { work->Run(); });
  work->Run();
  std::unique_lock<std::mutex> lock(work->mutex);
  work->finished.wait(lock, [&] { return work->done.load() == work->items; });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxformerPagedAttention, PagedAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, T, NQ, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // keys [K, N, block_size, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // values [K, N, block_size, H]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // tables [B, M]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // positions [B, T] (-1: padding)
                                  .Arg<ffi::Buffer<ffi::F32>>()  // sinks [NQ], or [0]: none
                                  .Attr<float>("scale")
                                  .Attr<float>("softcap")        // 0: none
                                  .Attr<int32_t>("window")       // a sliding window's slots; 0: none
                                  .Ret<ffi::Buffer<ffi::F32>>());  // [B, T, NQ, H]
