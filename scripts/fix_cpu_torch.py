"""Make the registry's CUDA-linked torchvision/torchaudio importable next to a CPU build of torch.

Only CUDA builds of torchvision 0.28 / torchaudio 2.11 exist on the package index. On CPU torch their
compiled extensions fail to load (``operator torchvision::nms does not exist``), yet LLaMA-Factory imports
torchaudio and transformers' Qwen2-VL video processor imports torchvision. The fix (../shared/
DEPENDENCIES.md): drop the compiled extensions and register torchvision's fake nms/qnms kernels only when
its ops exist. Idempotent; does nothing when torch is a CUDA build. Run by `make setup`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

MARK = "_mobilerl_guarded_fake"
HELPER = f'''
def {MARK}(name):  # added by mobilerl scripts/fix_cpu_torch.py: CPU torch has no torchvision ops
    from torchvision import extension

    if extension._has_ops():
        return torch.library.register_fake(name)
    return lambda fn: fn


'''


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(spec.origin).parent if spec and spec.origin else None


def main() -> int:
    import torch

    if torch.version.cuda is not None:
        print("fix_cpu_torch: CUDA build of torch, nothing to do")
        return 0
    changed: list[str] = []
    ta = _package_dir("torchaudio")
    if ta is not None:
        for so in sorted((ta / "lib").glob("*.so")):
            so.unlink()
            changed.append(f"torchaudio/lib/{so.name}")
    tv = _package_dir("torchvision")
    if tv is not None:
        for name in ("_C.so", "image.so"):
            if (tv / name).exists():
                (tv / name).unlink()
                changed.append(f"torchvision/{name}")
        meta = tv / "_meta_registrations.py"
        text = meta.read_text()
        if MARK not in text:
            first = text.index('@torch.library.register_fake("torchvision::nms")')
            text = text[:first] + HELPER.lstrip("\n") + text[first:]
            for op in ("nms", "qnms"):
                text = text.replace(f'@torch.library.register_fake("torchvision::{op}")',
                                    f'@{MARK}("torchvision::{op}")')
            meta.write_text(text)
            changed.append("torchvision/_meta_registrations.py")
    print("fix_cpu_torch:", ", ".join(changed) if changed else "already applied")
    return 0


if __name__ == "__main__":
    sys.exit(main())
