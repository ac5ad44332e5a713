// The bytes of one sparse message on the wire: how its values and indices
// travel. One format for every algorithm of the sparse allreduce that sends
// entries (allgather, recursive doubling, split-allgather, hash partition).
//
// WireFormat (the sparse allreduce's `wire` attribute: value dtype in bits 0-3,
// index encoding in bits 4-7):
//   float32 values, int32 indices: m SparseEntry (index, value) interleaved, 8 m
//     bytes (the format every algorithm sent before the wire format existed).
//   16-bit values, int32 indices: m int32 indices, then m 16-bit values: 6 m bytes.
//   index_encoding "auto": the index encoding of jax_sparse_sync/ops/index_encoding.py
//     (kind byte, uint32 count m, then a list, bit-packed gaps or a bitmap, whichever
//     is smallest for this message), then the m values (4 or 2 bytes each).
// All little-endian. Values in a 16-bit dtype are rounded to nearest even by the
// sender; the receiver widens them to float32 and sums in float32.
//
// Decoding validates: a message whose header, length, counts or indices do not
// fit (index outside [0, n), not strictly increasing, truncated) is an error with
// a message, never an out-of-bounds write.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/float_bits.h"
#include "kernels/sparse_stream.h"

namespace jss {

// The bit streams are read and written a 64-bit word at a time with memcpy,
// which takes the host's byte order for the wire's little-endian one.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "ffi/collectives/wire_codec.h reads its little-endian bit streams as host words");

struct WireFormat {
  int64_t value_dtype = 0;     // 0 float32, 1 bfloat16, 2 float16 (dense_allreduce's ids)
  int64_t index_encoding = 0;  // 0 int32, 1 auto (list / delta / bitmap, per message)

  static WireFormat from_word(int64_t word) { return WireFormat{word & 0xf, (word >> 4) & 0xf}; }
  int64_t word() const { return value_dtype | (index_encoding << 4); }
  bool plain() const { return value_dtype == 0 && index_encoding == 0; }
  int64_t value_bytes() const { return value_dtype == 0 ? 4 : 2; }
  bool valid() const {
    return value_dtype >= 0 && value_dtype <= 2 && index_encoding >= 0 && index_encoding <= 1;
  }
};

// ---- values ----------------------------------------------------------------

// v rounded to the wire dtype (nearest even) and widened back: what a receiver
// of v gets. The identity for float32.
inline float round_to_wire(float v, int64_t dtype) {
  if (dtype == 1) return FloatTraits<bfloat16_t>::to_float(FloatTraits<bfloat16_t>::from_float(v));
  if (dtype == 2) return FloatTraits<float16_t>::to_float(FloatTraits<float16_t>::from_float(v));
  return v;
}

inline uint16_t wire_bits16(float v, int64_t dtype) {
  return dtype == 1 ? float_to_bfloat16_bits(v) : float_to_half_bits(v);
}

inline float from_wire_bits16(uint16_t bits, int64_t dtype) {
  return dtype == 1 ? FloatTraits<bfloat16_t>::to_float(bfloat16_t{bits}) : half_to_float(bits);
}

inline void round_entries(std::vector<SparseEntry>* entries, int64_t dtype) {
  if (dtype == 0) return;
  for (SparseEntry& e : *entries) e.value = round_to_wire(e.value, dtype);
}

inline void round_floats(float* x, int64_t n, int64_t dtype) {
  if (dtype == 0) return;
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_wire(x[i], dtype);
}

// ---- index encodings (jax_sparse_sync/ops/index_encoding.py) ---------------

enum IndexKind : uint8_t { kIndexList = 0, kIndexDelta = 1, kIndexBitmap = 2 };
constexpr int64_t kIndexHeaderBytes = 5;  // kind byte + uint32 count

struct IndexSizes {
  int64_t list = kIndexHeaderBytes, delta = kIndexHeaderBytes, bitmap = kIndexHeaderBytes;
  int gap_width = 0;  // bit length of the largest gap idx[j] - idx[j-1] - 1
  int kind = kIndexList;  // the smallest (ties: list, then delta, then bitmap)
  int64_t chosen() const { return kind == kIndexList ? list : kind == kIndexDelta ? delta : bitmap; }
};

// The exact bytes of each encoding of the sorted distinct indices idx(0..m-1).
template <typename Index>
IndexSizes index_sizes(Index idx, int64_t m) {
  IndexSizes s;
  if (m == 0) return s;
  int64_t max_gap = 0;
  for (int64_t j = 1; j < m; ++j) {
    const int64_t g = static_cast<int64_t>(idx(j)) - idx(j - 1) - 1;
    if (g > max_gap) max_gap = g;
  }
  while ((int64_t{1} << s.gap_width) <= max_gap) ++s.gap_width;
  const int64_t span = static_cast<int64_t>(idx(m - 1)) - idx(0) + 1;
  s.list = kIndexHeaderBytes + 4 * m;
  s.delta = kIndexHeaderBytes + 5 + ((m - 1) * s.gap_width + 7) / 8;
  s.bitmap = kIndexHeaderBytes + 4 + (span + 7) / 8;
  s.kind = kIndexList;
  int64_t best = s.list;
  if (s.delta < best) { s.kind = kIndexDelta; best = s.delta; }
  if (s.bitmap < best) s.kind = kIndexBitmap;
  return s;
}

namespace wire_detail {
inline void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
// The up to 8 bytes p[0..min(8, len)) as a little-endian word (bit t of byte i
// at bit 8 i + t: the streams' LSB-first bit order), zeros past len. Reading a
// word at a time is what makes the bit streams below cost O(entries), not
// O(bits): decoding the 25 % warm-up stage's bitmap of 2.7M indices bit by bit
// took 60.7 ms, 18.4 ms a word at a time (benchmarks/wire_codec_time.py). The
// callers take a whole word with one memcpy where it fits (a helper that
// branched inside measured slower: the 1 % delta decode 0.6 -> 1.4 ms).
inline uint64_t load_le64(const uint8_t* p, int64_t len) {
  uint64_t v = 0;
  const int64_t take = len < 8 ? (len > 0 ? len : 0) : 8;
  for (int64_t i = 0; i < take; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}
inline void store_le64(uint8_t* p, int64_t len, uint64_t v) {
  const int64_t take = len < 8 ? (len > 0 ? len : 0) : 8;
  for (int64_t i = 0; i < take; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
// decode_indices' error for a decoded index out of [0, n) or not increasing.
[[gnu::noinline, gnu::cold]] inline void bad_index(int64_t j, int64_t index, int64_t prev,
                                                   int64_t n, std::string* error) {
  *error = "decoded index " + std::to_string(index) + " at position " + std::to_string(j) +
           (index >= n ? " is outside [0, " + std::to_string(n) + ")"
                       : " does not increase (previous " + std::to_string(prev) + ")");
}
}  // namespace wire_detail

// Appends the encoding of idx(0..m-1) (sorted, distinct, in [0, 2^31)) to
// `out`: the smallest of the three (as index_sizes' `kind`). Returns the kind.
template <typename Index, typename Byte>
int encode_indices(Index idx, int64_t m, std::vector<Byte>* out) {
  static_assert(sizeof(Byte) == 1, "encode_indices appends bytes");
  using wire_detail::put_u32;
  const IndexSizes s = index_sizes(idx, m);
  const int kind = m == 0 ? kIndexList : s.kind;
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>(m == 0 ? kIndexHeaderBytes : s.chosen()), 0);
  uint8_t* p = reinterpret_cast<uint8_t*>(out->data()) + at;
  p[0] = static_cast<uint8_t>(kind);
  put_u32(p + 1, static_cast<uint32_t>(m));
  p += kIndexHeaderBytes;
  if (m == 0) return kind;
  if (kind == kIndexList) {
    for (int64_t j = 0; j < m; ++j) put_u32(p + 4 * j, static_cast<uint32_t>(idx(j)));
  } else if (kind == kIndexDelta) {
    const int b = s.gap_width;  // <= 31: a gap and its bit offset fit one 64-bit word
    p[0] = static_cast<uint8_t>(b);
    put_u32(p + 1, static_cast<uint32_t>(idx(0)));
    uint8_t* bits = p + 5;
    const int64_t len = ((m - 1) * b + 7) / 8;  // the stream's bytes (zeroed above)
    int64_t pos = 0;  // bit position in the gap stream, LSB first
    for (int64_t j = 1; j < m; ++j, pos += b) {
      const uint64_t g = static_cast<uint64_t>(static_cast<int64_t>(idx(j)) - idx(j - 1) - 1);
      uint8_t* at = bits + (pos >> 3);
      const int64_t room = len - (pos >> 3);
      if (room >= 8) {
        uint64_t w;
        std::memcpy(&w, at, 8);  // little-endian hosts (the static_assert at the top)
        w |= g << (pos & 7);
        std::memcpy(at, &w, 8);
      } else {
        wire_detail::store_le64(at, room, wire_detail::load_le64(at, room) | (g << (pos & 7)));
      }
    }
  } else {
    const int64_t first = idx(0);
    put_u32(p, static_cast<uint32_t>(first));
    uint8_t* bits = p + 4;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t pos = static_cast<int64_t>(idx(j)) - first;
      bits[pos >> 3] |= static_cast<uint8_t>(1u << (pos & 7));
    }
  }
  return kind;
}

// Decodes one index encoding at p[0..avail) into out[0..m) (indices only),
// checking every index is in [0, n) and strictly increasing. `consumed`: the
// encoding's length. false and `error` set on a malformed message.
inline bool decode_indices(const uint8_t* p, int64_t avail, int64_t n,
                           std::vector<SparseEntry>* out, int64_t* consumed, std::string* error) {
  using wire_detail::get_u32;
  if (avail < kIndexHeaderBytes) {
    *error = "index encoding shorter than its 5-byte header";
    return false;
  }
  const int kind = p[0];
  const int64_t m = get_u32(p + 1);
  if (kind > kIndexBitmap) {
    *error = "unknown index encoding kind " + std::to_string(kind);
    return false;
  }
  if (m > n) {
    *error = "index encoding claims " + std::to_string(m) + " distinct indices in a dimension of " +
             std::to_string(n);
    return false;
  }
  const uint8_t* body = p + kIndexHeaderBytes;
  const int64_t left = avail - kIndexHeaderBytes;
  out->resize(static_cast<size_t>(m));
  *consumed = kIndexHeaderBytes;
  if (m == 0) return true;
  int64_t prev = -1;
  SparseEntry* dst = out->data();
  // The check and the store inline in every decode loop; the error's text is
  // built out of line (with it inside, `put` was a call per index with a
  // 400-byte frame: 14.7 % of the 25 % ramp stage's sparse allreduce, P = 2).
  auto put = [&](int64_t j, int64_t index) {
    if (index <= prev || index >= n) {
      wire_detail::bad_index(j, index, prev, n, error);
      return false;
    }
    dst[j].index = static_cast<int32_t>(index);
    prev = index;
    return true;
  };
  if (kind == kIndexList) {
    if (left < 4 * m) {
      *error = "list encoding truncated";
      return false;
    }
    for (int64_t j = 0; j < m; ++j) {
      if (!put(j, static_cast<int32_t>(get_u32(body + 4 * j)))) return false;
    }
    *consumed += 4 * m;
    return true;
  }
  if (kind == kIndexDelta) {
    if (left < 5) {
      *error = "delta encoding truncated";
      return false;
    }
    const int b = body[0];
    const int64_t bytes = ((m - 1) * b + 7) / 8;
    if (b > 31 || left < 5 + bytes) {
      *error = b > 31 ? "delta encoding's gap width exceeds 31 bits" : "delta encoding truncated";
      return false;
    }
    int64_t index = static_cast<int32_t>(get_u32(body + 1));
    if (!put(0, index)) return false;
    const uint8_t* bits = body + 5;
    const uint64_t mask = (uint64_t{1} << b) - 1;
    int64_t pos = 0;
    for (int64_t j = 1; j < m; ++j, pos += b) {
      const int64_t room = bytes - (pos >> 3);
      uint64_t w;
      if (room >= 8) {
        std::memcpy(&w, bits + (pos >> 3), 8);
      } else {
        w = wire_detail::load_le64(bits + (pos >> 3), room);
      }
      const int64_t g = static_cast<int64_t>((w >> (pos & 7)) & mask);
      index += g + 1;
      if (!put(j, index)) return false;
    }
    *consumed += 5 + bytes;
    return true;
  }
  // bitmap: the m set bits after the first index; its length ends at the byte
  // holding the last one (the encoder writes exactly ceil(span / 8) bytes).
  if (left < 4) {
    *error = "bitmap encoding truncated";
    return false;
  }
  const int64_t first = static_cast<int32_t>(get_u32(body));
  const uint8_t* bits = body + 4;
  const int64_t len = left - 4;
  int64_t j = 0, end = 0;  // end: one past the bit of the last index taken
  for (int64_t byte = 0; byte < len && j < m; byte += 8) {
    uint64_t w;
    if (len - byte >= 8) {
      std::memcpy(&w, bits + byte, 8);
    } else {
      w = wire_detail::load_le64(bits + byte, len - byte);
    }
    for (; w != 0 && j < m; w &= w - 1, ++j) {
      const int64_t pos = 8 * byte + __builtin_ctzll(w);
      if (!put(j, first + pos)) return false;
      end = pos + 1;
    }
  }
  if (j < m) {
    *error = "bitmap encoding truncated (fewer set bits than its count)";
    return false;
  }
  *consumed += 4 + (end + 7) / 8;
  return true;
}

// ---- whole messages ----------------------------------------------------------

// The bytes of a message of m entries where that does not depend on the
// indices (index_encoding 0): 8 m for float32, 6 m for 16-bit values.
inline int64_t list_message_bytes(int64_t m, WireFormat f) { return m * (4 + f.value_bytes()); }

// The most bytes a message of at most m entries can take in format f (an
// encoded message is never longer than its list with a header): the bound a
// receiver checks a peer's announced length against before allocating.
inline int64_t max_message_bytes(int64_t m, WireFormat f) {
  return kIndexHeaderBytes + list_message_bytes(m, f);
}

// The message of entries e[0..m) (sorted, distinct indices) in format f,
// written over `out`. Values are rounded to f's value dtype.
inline void pack_entries(const SparseEntry* e, int64_t m, WireFormat f, std::vector<char>* out) {
  out->clear();
  if (f.plain()) {
    out->resize(static_cast<size_t>(m) * sizeof(SparseEntry));
    if (m > 0) std::memcpy(out->data(), e, out->size());
    return;
  }
  // Written straight into `out`: the indices (resized once to their exact size),
  // then the values behind them, in room reserved for the longest message (the
  // values' resize otherwise moved the indices to a new block: at 25 %, 12 MB).
  out->reserve(static_cast<size_t>(max_message_bytes(m, f)));
  if (f.index_encoding == 0) {
    out->resize(static_cast<size_t>(4 * m));
    uint8_t* p = reinterpret_cast<uint8_t*>(out->data());
    for (int64_t j = 0; j < m; ++j) wire_detail::put_u32(p + 4 * j, static_cast<uint32_t>(e[j].index));
  } else {
    encode_indices([e](int64_t j) { return e[j].index; }, m, out);
  }
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>(m * f.value_bytes()));
  uint8_t* v = reinterpret_cast<uint8_t*>(out->data()) + at;
  for (int64_t j = 0; j < m; ++j) {
    if (f.value_dtype == 0) {
      std::memcpy(v + 4 * j, &e[j].value, 4);
    } else {
      const uint16_t b = wire_bits16(e[j].value, f.value_dtype);
      v[2 * j] = static_cast<uint8_t>(b);
      v[2 * j + 1] = static_cast<uint8_t>(b >> 8);
    }
  }
}

// The entries of a message of exactly `nbytes` bytes in format f, every index
// checked against [0, n) and for strict increase. false and `error` set when
// the message is malformed.
inline bool unpack_entries(const char* message, int64_t nbytes, int64_t n, WireFormat f,
                           std::vector<SparseEntry>* out, std::string* error) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(message);
  int64_t m = 0, index_bytes = 0;
  if (f.plain()) {
    if (nbytes % static_cast<int64_t>(sizeof(SparseEntry)) != 0) {
      *error = "message of " + std::to_string(nbytes) + " bytes is not a whole number of entries";
      return false;
    }
    m = nbytes / static_cast<int64_t>(sizeof(SparseEntry));
    out->resize(static_cast<size_t>(m));
    if (m > 0) std::memcpy(out->data(), message, static_cast<size_t>(nbytes));
    int64_t prev = -1;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t index = (*out)[static_cast<size_t>(j)].index;
      if (index <= prev || index >= n) {
        *error = "received index " + std::to_string(index) + " at position " + std::to_string(j) +
                 " is outside [0, " + std::to_string(n) + ") or out of order";
        return false;
      }
      prev = index;
    }
    return true;
  }
  if (f.index_encoding == 0) {
    const int64_t entry = 4 + f.value_bytes();
    if (nbytes % entry != 0) {
      *error = "message of " + std::to_string(nbytes) + " bytes is not a whole number of entries";
      return false;
    }
    m = nbytes / entry;
    // the list encoding's body without its header: decode through a header in front
    std::vector<uint8_t> framed(static_cast<size_t>(kIndexHeaderBytes + 4 * m));
    framed[0] = kIndexList;
    wire_detail::put_u32(framed.data() + 1, static_cast<uint32_t>(m));
    if (m > 0) std::memcpy(framed.data() + kIndexHeaderBytes, p, static_cast<size_t>(4 * m));
    if (m > n) {
      *error = "message holds more entries than the dimension";
      return false;
    }
    if (!decode_indices(framed.data(), static_cast<int64_t>(framed.size()), n, out, &index_bytes,
                        error)) {
      return false;
    }
    index_bytes = 4 * m;
  } else {
    if (!decode_indices(p, nbytes, n, out, &index_bytes, error)) return false;
    m = static_cast<int64_t>(out->size());
  }
  if (nbytes != index_bytes + m * f.value_bytes()) {
    *error = "message of " + std::to_string(nbytes) + " bytes does not hold " + std::to_string(m) +
             " values after its " + std::to_string(index_bytes) + " index bytes";
    return false;
  }
  const uint8_t* v = p + index_bytes;
  for (int64_t j = 0; j < m; ++j) {
    float value;
    if (f.value_dtype == 0) {
      std::memcpy(&value, v + 4 * j, 4);
    } else {
      value = from_wire_bits16(static_cast<uint16_t>(v[2 * j] | (v[2 * j + 1] << 8)), f.value_dtype);
    }
    (*out)[static_cast<size_t>(j)].value = value;
  }
  return true;
}

}  // namespace jss
