"""The check layer: run models in onnxruntime and judge their outputs (verify, fp16 emulation,
precision analysis). Sits above the IR and the cost model, below the passes."""
