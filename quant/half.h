/*
 * half.h — IEEE binary16 conversions in plain C, bit-exact with CUDA's __float2half_rn and
 * __half2float, so that the CPU reference and the GPU kernels store the same fp16 bits.
 */
#ifndef MKV_QUANT_HALF_H
#define MKV_QUANT_HALF_H

#include "quant/format.h"

#include <stdint.h>
#include <string.h>

#define MKV_F16_MAX 65504.0f

MKV_HD uint32_t mkv_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

MKV_HD float mkv_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* float -> fp16, round to nearest even; overflow gives +-inf, NaN stays NaN (quiet). */
MKV_HD uint16_t mkv_f32_to_f16(float f)
{
    const uint32_t x = mkv_f32_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x0200u : 0u));
#if defined(__CUDA_ARCH__)
    { /* the same rounding in one instruction (finite inputs; NaN keeps the payload rule above) */
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return (uint16_t)h;
    }
#endif
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (absx < 0x38800000u) { /* below 2^-14: subnormal half or zero */
        if (absx < 0x33000000u) return (uint16_t)sign; /* below half of the smallest subnormal */
        const uint32_t exp = absx >> 23;
        const uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - exp; /* 14..24 */
        uint32_t h = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((absx >> 13) - (112u << 10)); /* rebias exponent 127 -> 15 */
    const uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

/* fp16 -> float, exact. */
MKV_HD float mkv_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu) return mkv_bits_f32(sign | 0x7f800000u | (mant << 13));
#if defined(__CUDA_ARCH__)
    { /* exact either way; one instruction on the device (inf and NaN keep the rule above) */
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
        return f;
    }
#endif
    if (exp == 0) {
        if (mant == 0) return mkv_bits_f32(sign);
        /* subnormal: mant * 2^-24 */
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return mkv_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* bf16 -> float, exact. */
MKV_HD float mkv_bf16_to_f32(uint16_t b)
{
    return mkv_bits_f32((uint32_t)b << 16);
}

/* float -> bf16, round to nearest even; NaN stays NaN (quiet). */
MKV_HD uint16_t mkv_f32_to_bf16(float f)
{
    const uint32_t x = mkv_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#endif /* MKV_QUANT_HALF_H */
