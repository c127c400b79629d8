"""Writes a krab state file of the first formats around a TorchScript archive that runs code.

Usage: forge_state.py checkpoint|fl-state TARGET OUT

The archive holds a scripted module whose __setstate__ calls torch.from_file(TARGET,
shared=True, size=64), which creates TARGET: torch.jit.load runs __setstate__ while it loads.
The frame is what krab wrote before state files became records, with a valid CRC, so a krab
that still parsed those formats would load the archive (and create TARGET) before any check of
its own could refuse it. Used by tests/train/state_files_e2e_test.cpp.
"""
import importlib.util
import io
import os
import struct
import sys
import zlib

import torch

kind, target, out = sys.argv[1], sys.argv[2], sys.argv[3]

SOURCE = '''
class Forged(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.x = 1

    def forward(self, x: int) -> int:
        return x + self.x

    @torch.jit.export
    def __getstate__(self) -> Tuple[int, bool]:
        return (self.x, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[int, bool]) -> None:
        # The result is used, so that the compiler keeps the call.
        written = torch.from_file(TARGET, shared=True, size=64)
        self.x = state[0] + written.numel() - 64
        self.training = state[1]
'''.replace('TARGET', repr(target))
# torch.jit.script reads a class's source: give it a file to read it from.
path = out + '.py'
with open(path, 'w') as f:
    f.write('import torch\nfrom typing import Tuple\n' + SOURCE)
spec = importlib.util.spec_from_file_location('forged', path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
buf = io.BytesIO()
torch.jit.save(torch.jit.script(module.Forged()), buf)
payload = buf.getvalue()
os.remove(path)
crc = zlib.crc32(payload) & 0xFFFFFFFF
if kind == 'checkpoint':
    frame = b'KRABCKPT' + struct.pack('<IQI', 1, len(payload), crc)
elif kind == 'fl-state':
    frame = b'KRABFLS1' + struct.pack('<QI', len(payload), crc)
else:
    sys.exit('kind must be checkpoint or fl-state')
with open(out, 'wb') as f:
    f.write(frame + payload)
