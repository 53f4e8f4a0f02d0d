"""A DDPM training step with a small UNet, as in the diffusion tutorials: a sinusoidal timestep
embedding, residual blocks with GroupNorm and the timestep added, a self-attention block written
with einsum, a strided-convolution downsampling and a nearest upsampling with a skip connection;
the noise schedule is a pair of buffers indexed by the random timesteps of each batch."""

import math

import torch
import torch.nn.functional as F
from torch import nn


def timestep_embedding(t, dim: int):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    angles = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, tdim: int):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(4, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.time = nn.Linear(tdim, cout)
        self.norm2, self.conv2 = nn.GroupNorm(4, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.dropout(F.silu(self.norm2(h)), 0.1, self.training))
        return h + self.skip(x)


class AttentionBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(4, channels)
        self.qkv, self.proj = nn.Conv2d(channels, 3 * channels, 1), nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).unbind(1)
        weights = torch.softmax(torch.einsum("bci,bcj->bij", q, k) / math.sqrt(c), dim=-1)
        return x + self.proj(torch.einsum("bij,bcj->bci", weights, v).reshape(b, c, h, w))


class UNet(nn.Module):
    def __init__(self, ch: int = 8, tdim: int = 16):
        super().__init__()
        self.tdim = tdim
        self.time = nn.Sequential(nn.Linear(tdim, 2 * tdim), nn.SiLU(), nn.Linear(2 * tdim, tdim))
        self.stem = nn.Conv2d(1, ch, 3, padding=1)
        self.down1, self.downsample = ResBlock(ch, ch, tdim), nn.Conv2d(ch, ch, 3, stride=2, padding=1)
        self.down2, self.attention = ResBlock(ch, 2 * ch, tdim), AttentionBlock(2 * ch)
        self.middle = ResBlock(2 * ch, 2 * ch, tdim)
        self.upsample = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(2 * ch, ch, 3, padding=1))
        self.up1 = ResBlock(2 * ch, ch, tdim)
        self.head = nn.Sequential(nn.GroupNorm(4, ch), nn.SiLU(), nn.Conv2d(ch, 1, 3, padding=1))

    def forward(self, x, t):
        temb = self.time(timestep_embedding(t, self.tdim).to(x.dtype))
        skip = self.down1(self.stem(x), temb)
        h = self.middle(self.attention(self.down2(self.downsample(skip), temb)), temb)
        return self.head(self.up1(torch.cat([self.upsample(h), skip], dim=1), temb))


class Diffusion(nn.Module):
    """The noise-prediction loss of a batch at random timesteps of a linear beta schedule."""

    def __init__(self, steps: int = 50):
        super().__init__()
        self.unet, self.steps = UNet(), steps
        alphas_cumprod = torch.cumprod(1 - torch.linspace(1e-4, 0.02, steps, dtype=torch.float64), dim=0)
        self.register_buffer("sqrt_alphas_cumprod", alphas_cumprod.sqrt().float())
        self.register_buffer("sqrt_one_minus_alphas_cumprod", (1 - alphas_cumprod).sqrt().float())

    def forward(self, x0):
        t = torch.randint(0, self.steps, (x0.shape[0],), device=x0.device)
        noise = torch.randn_like(x0)
        signal = self.sqrt_alphas_cumprod[t].view(-1, 1, 1, 1)
        xt = signal * x0 + self.sqrt_one_minus_alphas_cumprod.gather(0, t)[:, None, None, None] * noise
        return F.mse_loss(self.unet(xt, t), noise)
