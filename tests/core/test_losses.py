"""Losses against hand-computed numbers (OAIF Eq. 1-3) and the soft-label example of
rlaif-constitutional-ai.txt."""

import math

import pytest
import torch

from pofe.losses import LOSSES, default_beta, dpo, ipo, slic

# One pair: policy logps (chosen -1, rejected -2), reference (-1.5, -1.5):
# h = (-1 - -1.5) - (-2 - -1.5) = 0.5 + 0.5 = 1.0
PC, PR, RC, RR = (torch.tensor([x]) for x in (-1.0, -2.0, -1.5, -1.5))


def test_paper_default_betas():
    assert {n: default_beta(n) for n in LOSSES} == {"dpo": 0.1, "ipo": 1.0, "slic": 0.002}


def test_dpo_hard_label_eq1():
    out = dpo(PC, PR, RC, RR, beta=0.1)
    # -log sigma(0.1) = log(1 + e^-0.1) = log(1.904837) = 0.644397
    assert out.losses.item() == pytest.approx(0.644397, abs=1e-6)
    assert out.chosen_rewards.item() == pytest.approx(0.05)
    assert out.rejected_rewards.item() == pytest.approx(-0.05)
    assert out.margins.item() == pytest.approx(0.1)
    assert out["losses"] is out.losses  # dict-style access


def test_ipo_hard_and_soft_eq2():
    # beta = 1: target 1/(2*1) = 0.5, loss (1 - 0.5)^2 = 0.25
    assert ipo(PC, PR, RC, RR, beta=1.0).losses.item() == pytest.approx(0.25)
    # soft p = 0.75: target (2*0.75 - 1)/2 = 0.25, loss (1 - 0.25)^2 = 0.5625
    assert ipo(PC, PR, RC, RR, beta=1.0, p=0.75).losses.item() == pytest.approx(0.5625)
    # p = 0.5: target 0, loss 1
    assert ipo(PC, PR, RC, RR, beta=1.0, p=0.5).losses.item() == pytest.approx(1.0)


def test_slic_hard_and_soft_eq3():
    # beta*h = 0.002: hinge 1 - 0.002 = 0.998
    assert slic(PC, PR, RC, RR, beta=0.002).losses.item() == pytest.approx(0.998)
    # p = 0.75: 0.75 * 0.998 + 0.25 * 1.002 = 0.999
    assert slic(PC, PR, RC, RR, beta=0.002, p=0.75).losses.item() == pytest.approx(0.999)
    # margin above 1/beta: hard hinge is exactly 0
    big = torch.tensor([1000.0])
    assert slic(big, PR, RC, RR, beta=0.002).losses.item() == 0.0


def test_dpo_soft_label_equals_bt_cross_entropy():
    p = 0.7
    z = 0.1  # beta * h
    expected = -(p * math.log(1 / (1 + math.exp(-z))) + (1 - p) * math.log(1 / (1 + math.exp(z))))
    assert dpo(PC, PR, RC, RR, beta=0.1, p=p).losses.item() == pytest.approx(expected, abs=1e-6)


def _dpo_loss_and_grad(margin: float, p: float):
    h = torch.tensor([float(margin)], requires_grad=True)
    zero = torch.zeros(1)
    loss = dpo(h, zero, zero, zero, beta=1.0, p=p).losses.sum()
    loss.backward()
    return loss.item(), h.grad.item()


def test_soft_bt_minimised_at_logit_p_worked_example():
    # rlaif-constitutional-ai.txt: debiased label 0.581 -> the loss is minimised at margin
    # logit(0.581) = ln(0.581/0.419) = 0.3269, and d loss / d margin = sigma(margin) - p.
    p = 0.581
    star = math.log(p / (1 - p))
    assert star == pytest.approx(0.33, abs=0.005)
    l_star, g_star = _dpo_loss_and_grad(star, p)
    assert g_star == pytest.approx(0.0, abs=1e-6)
    l0, g0 = _dpo_loss_and_grad(0.0, p)
    assert g0 == pytest.approx(0.5 - 0.581, abs=1e-6)  # negative: push the margin up
    l1, g1 = _dpo_loss_and_grad(1.0, p)
    assert g1 == pytest.approx(1 / (1 + math.exp(-1)) - 0.581, abs=1e-6)  # positive: pull it down
    assert l_star < l0 and l_star < l1
    # the gradient vanishes only at logit(p): scan a grid
    for m in [-2, -1, 0, 0.2, 0.5, 1, 2]:
        assert abs(_dpo_loss_and_grad(m, p)[1]) > 1e-3


def test_batched_per_pair_losses_and_tensor_p():
    pc = torch.tensor([-1.0, -3.0])
    pr = torch.tensor([-2.0, -1.0])
    z = torch.zeros(2)
    out = dpo(pc, pr, z, z, beta=1.0, p=torch.tensor([1.0, 0.0]))
    # pair 1: h = 1, p = 1: -log sigma(1) = 0.313262; pair 2: h = -2, p = 0: -log sigma(2) = 0.126928
    assert out.losses.tolist() == pytest.approx([0.313262, 0.126928], abs=1e-6)


def test_rejects_out_of_range_p():
    with pytest.raises(ValueError):
        dpo(PC, PR, RC, RR, beta=0.1, p=1.5)
