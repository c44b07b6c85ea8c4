package swiftkv

/*
#include <stdlib.h>
#include "swiftkv/swiftkv.h"
*/
import "C"

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
// the fixed codec of exact chunks entering host memory and the disk (raw: as they come).
type Compression struct {
	AcceptLossy bool
	Host        Codec
	Disk        Codec
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
	return check(func() C.swiftkv_status { return C.swiftkv_compression_set(h, C.uint32_t(m.ID), &cfg) })
}

// Compress re-encodes the chunks of tokens under codec where they are; how many are under it
// afterwards.
func (m *Model) Compress(tokens []uint32, codec Codec) (uint64, error) {
	h, done, err := m.ctx.acquire()
	if err != nil {
		return 0, err
	}
	defer done()
	p := codec.toC()
	var n C.uint64_t
	err = check(func() C.swiftkv_status {
		return C.swiftkv_compress(&n, h, C.uint32_t(m.ID), tokensPtr(tokens), C.size_t(len(tokens)), &p)
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
