package swiftkv

/*
#include <stdlib.h>
#include "swiftkv/swiftkv.h"
*/
import "C"

import "fmt"

// CodecKind names a chunk encoding (docs/codecs.md gives the formats and error bounds).
type CodecKind uint32

const (
	CodecRaw  CodecKind = C.SWIFTKV_CODEC_RAW
	CodecZstd CodecKind = C.SWIFTKV_CODEC_ZSTD // lossless; EUNSUPPORTED without libzstd
	CodecKivi CodecKind = C.SWIFTKV_CODEC_KIVI // lossy: 8, 4 or 2 bits, keys per channel
	CodecFP8  CodecKind = C.SWIFTKV_CODEC_FP8  // lossy: FP8 E4M3, a scale per token
)

// Codec is an encoding: Bits and Group are KIVI's, BytePlanes and ZstdLevel zstd's; the fields
// another codec uses must be zero (ZstdLevel: any).
type Codec struct {
	Kind       CodecKind
	Bits       uint32
	Group      uint32
	BytePlanes bool
	ZstdLevel  int32 // 1..19; 0 takes the library's default
}

func (c Codec) toC() C.swiftkv_codec_params {
	var p C.swiftkv_codec_params
	C.swiftkv_codec_params_init(&p)
	p.codec = C.swiftkv_codec(c.Kind)
	p.bits = C.uint32_t(c.Bits)
	p.group = C.uint32_t(c.Group)
	if c.BytePlanes {
		p.byte_planes = 1
	}
	if c.ZstdLevel != 0 {
		p.zstd_level = C.int32_t(c.ZstdLevel)
	}
	return p
}

// Compression is what a model asks of compression: whether loads may return lossy chunks, and
// either the fixed codec of exact chunks entering host memory and the disk (raw: as they come)
// or, with Adaptive set, the utility policy that chooses each chunk's encoding (docs/codecs.md).
type Compression struct {
	AcceptLossy bool
	Host        Codec
	Disk        Codec
	Adaptive    *Adaptive // adaptive mode; Host and Disk must then be raw
}

// Method is one the adaptive policy may choose, with the engine's own quality (in [0, 1]) and
// decoder speed for it; a negative Quality or a zero DecodeGBps: the library measures it.
type Method struct {
	Codec      Codec
	Quality    float64
	DecodeGBps float64
}

// MeasuredMethod is a method whose quality and decoder speed the library measures.
func MeasuredMethod(c Codec) Method { return Method{Codec: c, Quality: -1} }

// Adaptive holds the adaptive policy's parameters; DefaultAdaptive gives the library's. No
// Methods: the default set.
type Adaptive struct {
	Alpha         float64 // seconds of load time that one reuse's full quality is worth
	ReuseHorizonS float64 // a chunk idle this long counts half as likely to be reused
	HostGBps      float64
	DiskGBps      float64
	RecomputeGBps float64 // KV a recompute makes per second: a dropped chunk's cost
	Methods       []Method
}

// DefaultAdaptive is the library's adaptive policy (SWIFTKV_COMPRESSION_CONFIG_INIT).
func DefaultAdaptive() Adaptive {
	var cfg C.swiftkv_compression_config
	C.swiftkv_compression_config_init(&cfg)
	return Adaptive{
		Alpha:         float64(cfg.alpha),
		ReuseHorizonS: float64(cfg.reuse_horizon_s),
		HostGBps:      float64(cfg.host_gbps),
		DiskGBps:      float64(cfg.disk_gbps),
		RecomputeGBps: float64(cfg.recompute_gbps),
	}
}

// SetCompression sets what the model asks of compression, from now on.
func (m *Model) SetCompression(c Compression) error {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return err
	}
	defer done()
	var cfg C.swiftkv_compression_config
	C.swiftkv_compression_config_init(&cfg)
	if c.AcceptLossy {
		cfg.accept_lossy = 1
	}
	cfg.host = c.Host.toC()
	cfg.disk = c.Disk.toC()
	if a := c.Adaptive; a != nil {
		if len(a.Methods) > len(cfg.methods) {
			return &Error{Status: EINVAL, Message: fmt.Sprintf("at most %d methods, not %d", len(cfg.methods), len(a.Methods))}
		}
		cfg.adaptive = 1
		cfg.alpha = C.double(a.Alpha)
		cfg.reuse_horizon_s = C.double(a.ReuseHorizonS)
		cfg.host_gbps = C.double(a.HostGBps)
		cfg.disk_gbps = C.double(a.DiskGBps)
		cfg.recompute_gbps = C.double(a.RecomputeGBps)
		cfg.n_methods = C.uint32_t(len(a.Methods))
		for i, meth := range a.Methods {
			cfg.methods[i].params = meth.Codec.toC()
			cfg.methods[i].quality = C.double(meth.Quality)
			cfg.methods[i].decode_gbps = C.double(meth.DecodeGBps)
		}
	}
	return check(func() C.swiftkv_status { return C.swiftkv_compression_set(h, C.uint32_t(m.ID), &cfg) })
}

// CompressByPolicy re-encodes the chunks of tokens where they are under what the model's
// adaptive policy chooses for each (EINVAL in fixed mode); how many are stored as it chose.
func (m *Model) CompressByPolicy(tokens []uint32) (uint64, error) {
	return m.compress(tokens, nil)
}

// Compress re-encodes the chunks of tokens under codec where they are; how many are under it
// afterwards.
func (m *Model) Compress(tokens []uint32, codec Codec) (uint64, error) {
	p := codec.toC()
	return m.compress(tokens, &p)
}

// compress is swiftkv_compress; nil params: the adaptive policy chooses.
func (m *Model) compress(tokens []uint32, p *C.swiftkv_codec_params) (uint64, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	var n C.uint64_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_compress(&n, h, C.uint32_t(m.ID), tokensPtr(tokens), C.size_t(len(tokens)), p)
	})
	return uint64(n), err
}

// ChunkInfo is how one chunk is cached.
type ChunkInfo struct {
	Tier        Tier
	Codec       Codec // its ZstdLevel is not kept: 0
	Lossy       bool
	StoredBytes uint64
}

// ChunkInfo reports how each full chunk of tokens is cached, recording no activity.
func (m *Model) ChunkInfo(tokens []uint32) ([]ChunkInfo, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return nil, err
	}
	defer done()
	n := len(tokens) / int(m.Desc.ChunkTokens)
	info := make([]C.swiftkv_chunk_info, n+1) // never empty: its address is passed
	var chunks C.size_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_chunk_info_get(&info[0], C.size_t(n), &chunks, h, C.uint32_t(m.ID), tokensPtr(tokens), C.size_t(len(tokens)))
	})
	if err != nil {
		return nil, err
	}
	out := make([]ChunkInfo, 0, n)
	for _, v := range info[:n] {
		out = append(out, ChunkInfo{
			Tier:        Tier(v.tier),
			Codec:       Codec{Kind: CodecKind(v.codec), Bits: uint32(v.bits), Group: uint32(v.group), BytePlanes: v.byte_planes != 0},
			Lossy:       v.lossy != 0,
			StoredBytes: uint64(v.stored_bytes),
		})
	}
	return out, nil
}

// ChunkInfoNamed is ChunkInfo for chunks named by the caller (names of nameBytes bytes each).
func (m *Model) ChunkInfoNamed(names []byte, nameBytes uint32) ([]ChunkInfo, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return nil, err
	}
	defer done()
	n := 0
	if nameBytes != 0 {
		n = len(names) / int(nameBytes)
	}
	info := make([]C.swiftkv_chunk_info, n+1) // never empty: its address is passed
	var chunks C.size_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_chunk_info_get_named(&info[0], C.size_t(n), &chunks, h, C.uint32_t(m.ID),
			bytesPtr(names), C.size_t(len(names)), C.uint32_t(nameBytes))
	})
	if err != nil {
		return nil, err
	}
	out := make([]ChunkInfo, 0, n)
	for _, v := range info[:n] {
		out = append(out, ChunkInfo{
			Tier:        Tier(v.tier),
			Codec:       Codec{Kind: CodecKind(v.codec), Bits: uint32(v.bits), Group: uint32(v.group), BytePlanes: v.byte_planes != 0},
			Lossy:       v.lossy != 0,
			StoredBytes: uint64(v.stored_bytes),
		})
	}
	return out, nil
}

// CodecStats counts cached chunks by codec (rows: CodecKind) and tier (columns: Tier).
type CodecStats struct {
	Chunks, RawBytes, StoredBytes  [4][3]uint64
	Encodes, Decodes, LossyRefused uint64
}

// CodecStats reports the cached chunks and bytes by codec and tier.
func (c *Context) CodecStats() (CodecStats, error) {
	h, done, err := c.acquire()
	if err != nil {
		return CodecStats{}, err
	}
	defer done()
	var s C.swiftkv_codec_stats
	C.swiftkv_codec_stats_init(&s)
	if err := check(func() C.swiftkv_status { return C.swiftkv_codec_stats_get(&s, h) }); err != nil {
		return CodecStats{}, err
	}
	var out CodecStats
	for k := 0; k < 4; k++ {
		for t := 0; t < 3; t++ {
			out.Chunks[k][t] = uint64(s.chunks[k][t])
			out.RawBytes[k][t] = uint64(s.raw_bytes[k][t])
			out.StoredBytes[k][t] = uint64(s.stored_bytes[k][t])
		}
	}
	out.Encodes, out.Decodes, out.LossyRefused = uint64(s.encodes), uint64(s.decodes), uint64(s.lossy_refused)
	return out, nil
}
