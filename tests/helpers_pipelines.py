"""Transform pipelines the image tests build again and again: a training
one (random crop and flip) and an evaluation one (resize, center crop),
from fastloader.transforms or, with lib=, torchvision's transforms (both
have the same class names), normalized with ImageNet's statistics unless
told otherwise."""
from fastloader import transforms as FT

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
IMAGENET = (MEAN, STD)


def _tail(lib, norm):
    return [lib.ToTensor()] + ([lib.Normalize(*norm)] if norm is not None else [])


def train_tf(size=32, lib=FT, norm=IMAGENET):
    """RandomResizedCrop(size), a random flip, to tensor; norm=(mean, std)
    or None (no Normalize)."""
    return lib.Compose([lib.RandomResizedCrop(size), lib.RandomHorizontalFlip()] + _tail(lib, norm))


def val_tf(resize=36, crop=32, lib=FT, norm=IMAGENET):
    """Resize(resize), CenterCrop(crop), to tensor, then as train_tf."""
    return lib.Compose([lib.Resize(resize), lib.CenterCrop(crop)] + _tail(lib, norm))
