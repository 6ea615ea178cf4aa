"""The id-only baselines: the candidate rate against counts by hand, the logistic regression
against its optimality conditions (the penalised gradient, computed here with numpy, vanishes at
the fit) and a case with a closed-form optimum; the hyper-parameter is chosen on validation."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemref.data.baselines import ALPHAS, LAMBDAS, Ids, ItemRate, Logistic, fit_baselines, log_loss


def ids(user, item, click, conversion=None) -> Ids:
    click = np.asarray(click, dtype=np.float64)
    conversion = click if conversion is None else np.asarray(conversion, dtype=np.float64)
    return Ids(np.asarray(user, dtype=np.int64), np.asarray(item, dtype=np.int64), np.stack([click, conversion], 1))


def test_the_candidate_rate_is_smoothed_counts():
    train = ids([0, 0, 1, 1, 2], [0, 0, 0, 1, 1], [1, 0, 1, 1, 0])
    model = ItemRate.fit(train, 0, n_items=3, alpha=2.0)
    p = 3 / 5                                         # the train base rate
    assert model.rate[0] == pytest.approx((2 + 2 * p) / (3 + 2))     # item 0: 2 of 3
    assert model.rate[1] == pytest.approx((1 + 2 * p) / (2 + 2))     # item 1: 1 of 2
    assert model.rate[2] == pytest.approx(p)                         # never seen: the base rate
    assert model.predict(ids([5], [2], [0]))[0] == pytest.approx(p)


def penalised_gradient(model: Logistic, train: Ids, task: int, n_users: int, n_items: int) -> np.ndarray:
    """d/d(b, w_u, w_i) of mean log loss + lam/2 (|w_u|^2 + |w_i|^2), by hand."""
    p = 1 / (1 + np.exp(-(model.bias + model.user_w[train.user] + model.item_w[train.item])))
    r = (p - train.labels[:, task]) / len(p)
    gb = r.sum()
    gu = np.bincount(train.user, weights=r, minlength=n_users) + model.lam * model.user_w
    gi = np.bincount(train.item, weights=r, minlength=n_items) + model.lam * model.item_w
    return np.concatenate([[gb], gu, gi])


@settings(max_examples=20)
@given(st.integers(0, 10_000), st.sampled_from([1e-4, 1e-3, 1e-2]))
def test_the_logistic_fit_is_a_stationary_point_of_its_objective(seed, lam):
    rng = np.random.default_rng(seed)
    n, n_users, n_items = 300, 12, 20
    user, item = rng.integers(0, n_users, n), rng.zipf(1.5, n) % n_items      # skewed item counts
    logit = rng.normal(0, 1, n_users)[user] + rng.normal(0, 1, n_items)[item]
    train = ids(user, item, (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(float))
    model = Logistic.fit(train, 0, n_users, n_items, lam)
    grad = penalised_gradient(model, train, 0, n_users, n_items)
    assert np.abs(grad).max() <= 1e-6, np.abs(grad).max()


def test_one_user_and_one_item_fits_the_bias_to_the_rate():
    """Penalised weights and a free bias: the optimum puts everything in the bias, logit(rate)."""
    train = ids([0] * 10, [0] * 10, [1, 1, 1, 0, 0, 0, 0, 0, 0, 0])
    model = Logistic.fit(train, 0, 1, 1, 1e-3)
    assert model.bias == pytest.approx(np.log(0.3 / 0.7), abs=1e-6)
    assert abs(model.user_w[0]) < 1e-6 and abs(model.item_w[0]) < 1e-6
    assert model.predict(train)[0] == pytest.approx(0.3, abs=1e-6)


def test_hyper_parameters_come_from_the_validation_split_and_the_refit_uses_all_of_train():
    rng = np.random.default_rng(1)
    n, n_users, n_items = 2000, 30, 40
    user, item = rng.integers(0, n_users, n), rng.integers(0, n_items, n)
    logit = 2 * rng.normal(0, 1, n_items)[item]
    click = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(float)
    train = ids(user, item, click, 1 - click)
    fitted = fit_baselines(train, 0, n_users, n_items)
    assert fitted["item_rate"].alpha in ALPHAS and fitted["logistic"].lam in LAMBDAS
    full = ItemRate.fit(train, 0, n_items, fitted["item_rate"].alpha)
    np.testing.assert_allclose(fitted["item_rate"].rate, full.rate)
    # the ids carry the signal: both beat the constant on the data they were fitted on
    base = log_loss(np.full(n, click.mean()), click)
    for model in fitted.values():
        assert log_loss(model.predict(train), click) < base
    conv = fit_baselines(train, 1, n_users, n_items)          # the other label column
    assert conv["item_rate"].base == pytest.approx(1 - click.mean())


def test_log_loss_by_hand():
    assert log_loss(np.array([0.8, 0.4]), np.array([1.0, 0.0])) == pytest.approx(-(np.log(0.8) + np.log(0.6)) / 2)
