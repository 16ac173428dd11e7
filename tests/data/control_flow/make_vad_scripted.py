"""Writes vad_scripted.torchscript.onnx: a small voice-activity-shaped model exported by torch's
TorchScript exporter from a scripted module, so its control flow stays in the graph (issue 20):
an If on the sample-rate input, and a Loop over ``range(x.size(0))`` around an LSTM cell (the
trip count is 1 once the batch dim is static; the cell's weights are sliced and concatenated
inside the body). Weights seeded. Run with a torch venv (not needed by the tests):

    /work/venv-torch/bin/python tests/data/control_flow/make_vad_scripted.py
"""

from pathlib import Path

import torch
import torch.nn as nn


class Vad(nn.Module):
    def __init__(self):
        super().__init__()
        self.stft16 = nn.Conv1d(1, 8, 16, stride=8)
        self.stft8 = nn.Conv1d(1, 8, 8, stride=4)
        self.cell = nn.LSTMCell(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, sr: torch.Tensor):
        if sr.item() == 16000:
            x = x * 1.0
        else:
            x = x * 2.0
        if x.size(1) == 512:
            f = self.stft16(x.unsqueeze(1))
        else:
            f = self.stft8(x.unsqueeze(1))
        f = f.mean(dim=2)
        for _ in range(x.size(0)):
            h, c = self.cell(f, (h, c))
        y = torch.sigmoid(self.head(h.reshape(h.shape[0], -1)))
        return y, h, c


if __name__ == "__main__":
    torch.manual_seed(0)
    m = torch.jit.script(Vad().eval())
    x, h, c, sr = torch.randn(1, 512), torch.zeros(1, 8), torch.zeros(1, 8), torch.tensor(16000)
    torch.onnx.export(m, (x, h, c, sr), str(Path(__file__).with_name("vad_scripted.torchscript.onnx")),
                      input_names=["x", "h", "c", "sr"], output_names=["y", "hn", "cn"], opset_version=17,
                      dynamo=False)
