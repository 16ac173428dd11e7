"""Writes tiny_cnn.dynamo.opset20.onnx: a small CNN as torch's dynamo exporter writes it at
opset 20 (Conv, BatchNorm folded, Relu, chunk -> Split(num_outputs), Concat, mean ->
ReduceMean with an axes input, Linear -> Gemm, Gelu: the opset-20 op). Needs torch (run with
/work/venv-torch/bin/python from this folder); the test suite reads the committed file only."""

import torch


class TinyCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.c(x)))
        a, b = torch.chunk(y, 2, dim=1)
        y = torch.cat([b, a], 1).mean((2, 3))
        return torch.nn.functional.gelu(self.fc(y))


if __name__ == "__main__":
    torch.manual_seed(0)
    prog = torch.onnx.export(TinyCNN().eval(), (torch.randn(1, 3, 16, 16),), dynamo=True, opset_version=20,
                             dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    prog.save("tiny_cnn.dynamo.opset20.onnx", external_data=False)
