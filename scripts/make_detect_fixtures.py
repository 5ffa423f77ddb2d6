#!/usr/bin/env python3
"""Makes the detector parity fixtures: real crater image crops and pycda's U-Net outputs for them.

Cuts 256x256 crops (the U-Net's input) from a lunar NAC tile of ../shared/data/lro-nac and
from pycda's own Mars tile, runs pycda's Keras model (models/unet.h5 inside the pycda 0.1.16
sdist) with tf-keras, and stores:
  crates/detect/tests/fixtures/unet_reference.safetensors
      input  [n, 256, 256] u8   the crops (the model sees input / 255)
      output [n, 172, 172] f32  the per-pixel crater likelihood
Needs: numpy, tf-keras 2.21, safetensors (tf-keras is for this script only, never a
runtime dependency of craterdex).
Usage: python3 scripts/make_detect_fixtures.py PYCDA_SDIST [DATA_DIR]
"""
import io, sys, tarfile, pathlib, tempfile
import numpy as np
from PIL import Image
from safetensors.numpy import save_file
import tf_keras

sdist = sys.argv[1]
root = pathlib.Path(__file__).resolve().parents[1]
data = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else root.parent / "shared/data/lro-nac")
out = root / "crates/detect/tests/fixtures"
out.mkdir(parents=True, exist_ok=True)

with tarfile.open(sdist) as tar:
    member = lambda suffix: tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith(suffix))).read()
    weights = member("pycda/models/unet.h5")
    mars = np.array(Image.open(io.BytesIO(member("sample_imgs/holdout_tile.pgm"))).convert("L"))

with tempfile.NamedTemporaryFile(suffix=".h5") as f:
    f.write(weights)
    f.flush()
    model = tf_keras.models.load_model(f.name, compile=False)

nac = np.array(Image.open(data / "M1231933714_mosaic_train_small.png").convert("L"))
crops = np.stack([nac[300:556, 200:456], mars[700:956, 900:1156]]).astype(np.uint8)
likelihood = model.predict(crops[..., None].astype(np.float32) / 255.0, verbose=0)[..., 0]
save_file({"input": crops, "output": likelihood.astype(np.float32)}, str(out / "unet_reference.safetensors"))
print("wrote", out / "unet_reference.safetensors", crops.shape, likelihood.shape,
      "mean likelihood", likelihood.mean(), "share > 0.5", (likelihood > 0.5).mean())
