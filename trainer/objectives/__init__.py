"""What the denoiser is trained to predict, and the loss that compares it with the target.

Small pure functions on tensors, each citing its source: the DDPM objective (epsilon and
v-prediction, min-SNR and the noise options: :mod:`trainer.objectives.losses`) and flow matching
(sigma sampling, loss weighting, prediction types). May import torch and nothing of the trainer
but its config; the run (:mod:`trainer.run`) calls them.
"""
