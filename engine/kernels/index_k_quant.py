"""Index-K cache quantization: fp8 (e4m3fn + per-token fp32 scale), bf16 and fp32 storage.

Semantics (shared by the torch reference and the Triton kernels, bit for bit):

* ``fp8``:  ``scale[n] = max(amax(|x[n]|) / 448, 1e-8)``,
  ``values[n] = clamp(x[n] / scale[n], -448, 448)`` rounded to nearest-even float8_e4m3fn.
* ``bf16``: ``scale[n] = 1``, ``values = x`` rounded to nearest-even bfloat16.
* ``fp32``: ``scale[n] = 1``, ``values = x``.

Dequantization is always ``values.float() * scale[:, None]``.

Triton interpreter notes (``TRITON_INTERPRET=1``, checked with triton 3.9): the interpreter's
fp32->bf16 cast truncates instead of rounding and its fp32->fp8 cast is wrong near binade edges,
and its bf16 loads mishandle subnormals. The kernels therefore never rely on those casts: they
encode fp8/bf16 with explicit integer bit arithmetic (stored through ``uint8``/``int16`` views)
and decode bf16 by shifting its bits. Native fp8 *loads* are exact for every finite code (only
the NaN codes 0x7F/0xFF decode wrongly; the quantizer never produces them), so fp8 is loaded
natively. The same code paths are valid on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

FP8_MAX = 448.0
MIN_SCALE = 1e-8

KV_TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}
INDEX_K_TORCH_DTYPES: dict[str, torch.dtype] = {
    "fp8": torch.float8_e4m3fn,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
}

# Storage kind codes used as a tl.constexpr by every kernel that reads a cache.
KIND_FP32, KIND_BF16, KIND_FP8 = 0, 1, 2
_KIND_BY_DTYPE = {torch.float32: KIND_FP32, torch.bfloat16: KIND_BF16,
                  torch.float8_e4m3fn: KIND_FP8}


@dataclass(frozen=True)
class QuantizedIndexK:
    """Quantized index keys: ``values [N,Di]`` in the storage dtype, ``scale [N]`` fp32."""

    values: torch.Tensor
    scale: torch.Tensor


def storage_dtype(dtype: str) -> torch.dtype:
    """Torch dtype for a storage dtype name; raises ValueError listing the valid names."""
    if dtype not in INDEX_K_TORCH_DTYPES:
        raise ValueError(
            f"unknown index-K dtype {dtype!r}; valid: {', '.join(sorted(INDEX_K_TORCH_DTYPES))}")
    return INDEX_K_TORCH_DTYPES[dtype]


def storage_kind(t: torch.Tensor, what: str) -> int:
    """Kernel kind code for a cache tensor's dtype; raises ValueError for unsupported dtypes."""
    if t.dtype not in _KIND_BY_DTYPE:
        raise ValueError(f"{what} has unsupported dtype {t.dtype}; "
                         f"expected one of {sorted(str(d) for d in _KIND_BY_DTYPE)}")
    return _KIND_BY_DTYPE[t.dtype]


def kernel_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor a kernel reads: bf16 is passed as its int16 bits (decoded by ``load_f32``)."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


@triton.jit
def load_f32(ptrs, mask, KIND: tl.constexpr):
    """Load cache elements as fp32 (``KIND``: 0 fp32, 1 bf16 given as int16 bits, 2 fp8)."""
    if KIND == 1:
        bits = tl.load(ptrs, mask=mask, other=0).to(tl.int32)
        return (bits << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _f32_to_bf16_bits(x):
    """Round-to-nearest-even fp32 -> bf16, returned as int16 bits (finite inputs)."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).to(tl.uint16).to(tl.int16, bitcast=True)


@triton.jit
def _f32_to_e4m3_bits(y):
    """Round-to-nearest-even fp32 -> float8_e4m3fn bits (uint8); requires finite |y| <= 448."""
    bits = y.to(tl.uint32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    # Normal fp8 (|y| >= 2^-6): round the 23-bit mantissa to 3 bits; carries bump the exponent.
    rounded = mag + 0x7FFFF + ((mag >> 20) & 1)
    normal = (rounded >> 20) - (120 << 3)  # rebias exponent 127 -> 7
    # Subnormal fp8 (|y| < 2^-6): code = rint(|y| * 2^9) via the 2^23 magic-number trick.
    fmag = mag.to(tl.float32, bitcast=True)
    sub = ((fmag * 512.0 + 8388608.0) - 8388608.0).to(tl.uint32)
    code = tl.where(mag < 0x3C800000, sub, normal)  # 0x3C800000 == 2^-6
    code = tl.minimum(code, 0x7E)  # saturate at 448 (0x7F is NaN)
    return (code | sign).to(tl.uint8)


@triton.jit
def _quantize_kernel(x_ptr, val_ptr, scale_ptr, Di, stride_x, stride_v,
                     KIND: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < Di
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)  # [BLOCK_D]
    out = val_ptr + row * stride_v + offs
    if KIND == 2:
        amax = tl.max(tl.abs(x), axis=0)
        scale = tl.maximum(tl.math.div_rn(amax, 448.0), 1e-8)
        y = tl.math.div_rn(x, scale)
        y = tl.minimum(tl.maximum(y, -448.0), 448.0)
        tl.store(out, _f32_to_e4m3_bits(y), mask=mask)
        tl.store(scale_ptr + row, scale)
    else:
        if KIND == 1:
            tl.store(out, _f32_to_bf16_bits(x), mask=mask)
        else:
            tl.store(out, x, mask=mask)
        tl.store(scale_ptr + row, 1.0)


@triton.jit
def _dequantize_kernel(val_ptr, scale_ptr, out_ptr, Di, stride_v, stride_o,
                       KIND: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < Di
    vals = load_f32(val_ptr + row * stride_v + offs, mask, KIND)  # [BLOCK_D]
    scale = tl.load(scale_ptr + row)
    tl.store(out_ptr + row * stride_o + offs, vals * scale, mask=mask)


def _check_x(x: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"x must be [N,Di], got shape {tuple(x.shape)}")
    if x.dtype != torch.float32:
        raise ValueError(f"x must be float32, got {x.dtype}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"x must have unit stride on Di, got strides {x.stride()}")


def _check_pair(values: torch.Tensor, scale: torch.Tensor) -> None:
    if values.dim() != 2:
        raise ValueError(f"values must be [N,Di], got shape {tuple(values.shape)}")
    storage_kind(values, "values")
    if scale.shape != values.shape[:1] or scale.dtype != torch.float32:
        raise ValueError(f"scale must be float32 [{values.shape[0]}], "
                         f"got {scale.dtype} {tuple(scale.shape)}")
    if scale.device != values.device:
        raise ValueError(f"scale is on {scale.device} but values on {values.device}")
    if values.shape[1] > 1 and values.stride(1) != 1:
        raise ValueError(f"values must have unit stride on Di, got strides {values.stride()}")
    if not scale.is_contiguous():
        raise ValueError("scale must be contiguous")


def quantize_index_k_ref(x: torch.Tensor, dtype: str) -> QuantizedIndexK:
    """Torch reference quantizer: ``x [N,Di] fp32`` -> values in ``dtype`` storage + scale [N]."""
    _check_x(x)
    target = storage_dtype(dtype)
    if target != torch.float8_e4m3fn:
        ones = torch.ones(x.shape[0], dtype=torch.float32, device=x.device)  # [N]
        return QuantizedIndexK(values=x.to(target), scale=ones)
    amax = x.abs().amax(dim=-1) if x.shape[1] > 0 else x.new_zeros(x.shape[0])  # [N]
    scale = (amax / FP8_MAX).clamp_min(MIN_SCALE)  # [N]
    scaled = (x / scale[:, None]).clamp(-FP8_MAX, FP8_MAX)  # [N,Di]
    return QuantizedIndexK(values=scaled.to(target), scale=scale)


_FP8_TABLES: dict[torch.device, torch.Tensor] = {}


def _fp8_table(device: torch.device) -> torch.Tensor:
    """fp32 value of every float8_e4m3fn code ``[256]``, made by ``.float()`` itself."""
    table = _FP8_TABLES.get(device)
    if table is None:
        codes = torch.arange(256, dtype=torch.int32, device=device).to(torch.uint8)
        table = _FP8_TABLES[device] = codes.view(torch.float8_e4m3fn).float()
    return table


def upcast_f32(values: torch.Tensor) -> torch.Tensor:
    """``values.float()`` bit for bit; fp8 goes through a 256-entry table (faster on CPU)."""
    if values.dtype != torch.float8_e4m3fn or values.device.type != "cpu":
        return values.float()
    codes = values.contiguous().view(torch.uint8).reshape(-1).long()  # [numel]
    return _fp8_table(values.device).index_select(0, codes).view(values.shape)


def dequantize_index_k_ref(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Torch reference dequantizer: ``values [N,Di]``, ``scale [N]`` -> ``[N,Di]`` fp32."""
    _check_pair(values, scale)
    return upcast_f32(values) * scale[:, None]


def quantize_index_k_triton(x: torch.Tensor, dtype: str) -> QuantizedIndexK:
    """Triton quantizer, bitwise identical to ``quantize_index_k_ref`` for finite inputs.

    One program per token. fp8 and bf16 are rounded with integer bit arithmetic and written
    through ``uint8``/``int16`` views of the output (see the module docstring for why).
    """
    _check_x(x)
    target = storage_dtype(dtype)
    n, di = x.shape
    values = torch.empty((n, di), dtype=target, device=x.device)  # [N,Di]
    scale = torch.empty(n, dtype=torch.float32, device=x.device)  # [N]
    if n == 0:
        return QuantizedIndexK(values=values, scale=scale)
    kind = _KIND_BY_DTYPE[target]
    out = values.view(torch.uint8) if kind == KIND_FP8 else kernel_view(values)
    block_d = triton.next_power_of_2(max(di, 1))
    _quantize_kernel[(n,)](x, out, scale, di, x.stride(0), values.stride(0),
                           KIND=kind, BLOCK_D=block_d)
    return QuantizedIndexK(values=values, scale=scale)


def dequantize_index_k_triton(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Triton dequantizer, bitwise identical to ``dequantize_index_k_ref``. One program/token."""
    _check_pair(values, scale)
    n, di = values.shape
    out = torch.empty((n, di), dtype=torch.float32, device=values.device)  # [N,Di]
    if n == 0:
        return out
    block_d = triton.next_power_of_2(max(di, 1))
    _dequantize_kernel[(n,)](kernel_view(values), scale, out, di, values.stride(0), out.stride(0),
                             KIND=storage_kind(values, "values"), BLOCK_D=block_d)
    return out
