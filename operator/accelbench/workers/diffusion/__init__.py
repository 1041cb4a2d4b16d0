"""The diffusion super-resolution worker (SR3), the Gaudi-vs-NVIDIA study's image workload.

    images.py   the dataset format (a folder of PNG/JPEG files), synthetic datasets for tests, and
                the low-resolution view SR3 conditions on
    quality.py  PSNR and SSIM against the originals
    sr3.py      the conditional UNet (diffusers), DDP training, DDIM evaluation

`python -m accelbench.workers.diffusion` runs one training as the pod does (under torchrun for more
than one process) and writes its report as JSON.
"""
