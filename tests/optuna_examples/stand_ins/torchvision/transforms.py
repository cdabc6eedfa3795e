"""``transforms.ToTensor``: a float image in [0, 1] as a (1, 28, 28) tensor."""

import torch


class ToTensor:
    def __call__(self, image):
        return torch.as_tensor(image, dtype=torch.float32).unsqueeze(0)
