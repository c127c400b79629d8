// The federated sections of krab's configuration key table (config_key_table.cpp says how to
// add a key).
#include "core/config_key_specs.h"

namespace krab::core::key_specs {

// federated.*: rounds, cohorts, local work, partitions.
std::vector<KeySpec> federated_cohort_keys() {
  return {
      int_key("federated.rounds", "20", "Federated rounds the server runs.", 1),
      int_key("federated.clients", "10",
              "`fl-sim`: simulated clients the training split is divided among (`--clients` "
              "overrides); `fl-server`: clients to wait for before the first round.",
              1),
      float_key("federated.fraction", "0.1",
                "Fraction of the available clients sampled each round (at least "
                "`federated.min_clients`). With `federated.dp: central` each client is instead "
                "sampled independently with probability q = max(fraction, min_clients / "
                "available) (Poisson sampling, the accountant's assumption; docs/privacy.md).",
                1e-9, 1),
      int_key("federated.min_clients", "2",
              "Fewest clients a round samples, and fewest usable updates it needs; with fewer "
              "the round fails and the global model is unchanged. With `federated.dp: central` "
              "it is the fewest clients that must be available and the expected cohort size: a "
              "smaller Poisson cohort still releases its noised sum.",
              1),
      int_key("federated.local_epochs", "1",
              "Passes each client makes over its own data per round.", 1),
      int_key("federated.local_steps", "0",
              "Caps each client's optimizer steps per round; 0 = `federated.local_epochs` "
              "passes.",
              0),
      string_key(
          "federated.partition", "iid",
          "`fl-sim`: how the training split is divided among clients: `iid`, `classes` "
          "(`federated.classes_per_client` label shards each, FedAvg's pathological "
          "non-IID split) or `dirichlet` (label proportions ~ Dirichlet(`federated.alpha`)).",
          {"iid", "classes", "dirichlet"}),
      float_key("federated.alpha", "0.5",
                "`dirichlet` partition concentration: small is skewed, large is near IID.", 1e-6),
      int_key("federated.classes_per_client", "2", "`classes` partition: label shards per client.",
              1),
  };
}

// federated.*: strategies and robust aggregation.
std::vector<KeySpec> federated_aggregation_keys() {
  return {
      string_key("federated.strategy", "fedavg",
                 "Server strategy: `fedavg`, `fedprox` (clients add mu/2 ||w - w_global||^2), "
                 "`fedadam` or `fedyogi` (adaptive server optimizers).",
                 {"fedavg", "fedprox", "fedadam", "fedyogi"}),
      float_key("federated.server_lr", "1",
                "`fedavg`/`fedprox`: server step size on the averaged update.", 1e-9),
      float_key("federated.proximal_mu", "0.01", "`fedprox`: the proximal coefficient mu.", 0),
      float_key("federated.eta", "0.01", "`fedadam`/`fedyogi`: server learning rate.", 1e-9),
      float_key("federated.beta1", "0.9", "`fedadam`/`fedyogi`: first-moment decay.", 0, 0.999999),
      float_key("federated.beta2", "0.99", "`fedadam`/`fedyogi`: second-moment decay.", 0,
                0.999999),
      float_key("federated.tau", "0.001", "`fedadam`/`fedyogi`: adaptivity (epsilon) term.", 1e-12),
      string_key("federated.aggregator", "mean",
                 "How accepted updates are combined: `mean` (weighted by examples), `median`, "
                 "`trimmed_mean`, `krum` or `multi_krum` (robust to faulty or malicious clients).",
                 {"mean", "median", "trimmed_mean", "krum", "multi_krum"}),
      float_key("federated.trim_beta", "0.1",
                "`trimmed_mean`: fraction trimmed at each end per coordinate.", 0, 0.499999),
      int_key("federated.byzantine_f", "0", "`krum`/`multi_krum`: byzantine clients tolerated.", 0),
      int_key("federated.krum_m", "1", "`multi_krum`: lowest-score updates averaged.", 1),
      int_key("federated.max_client_examples", "1000000",
              "A client reporting more training examples than this is rejected: its example "
              "count is its weight in the mean, and it reports the count itself, so without a "
              "bound one liar outweighs every other client. The default is above any one "
              "client's share of the data sets krab is tried on (Fashion-MNIST holds 60,000 "
              "training examples in all); set it to the most a genuine client of your "
              "federation holds. 0 = no bound.",
              0),
      float_key("federated.max_update_norm", "0",
                "Updates with a larger L2 norm are rejected and logged; 0 = no bound.", 0),
  };
}

// federated.*: secure aggregation and differential privacy.
std::vector<KeySpec> federated_privacy_keys() {
  return {
      bool_key("federated.secure_aggregation", "false",
               "Sum updates under pairwise masks (Bonawitz et al. 2017): the server learns only "
               "the sum of the surviving clients."),
      float_key("federated.secagg_threshold", "0.66",
                "Secure aggregation: fraction of the cohort (Shamir threshold t) that must stay "
                "until the end; up to n - t clients may drop.",
                0.01, 1),
      float_key("federated.secagg_clip", "4",
                "Secure aggregation: each weighted update coordinate is clamped to "
                "[-clip, clip] before fixed-point encoding (sets the precision).",
                1e-6),
      string_key("federated.dp", "none",
                 "Client-level differential privacy: `none`, `central` (server adds noise to the "
                 "sum) or `local` (each client adds noise to its own update).",
                 {"none", "central", "local"}),
      float_key("federated.dp_clip", "1", "DP: each update is clipped to this L2 norm C.", 1e-9),
      float_key("federated.dp_noise_multiplier", "1",
                "DP: noise standard deviation as a multiple of C (sigma); must be > 0 with DP, "
                "and large enough that one round's epsilon is finite.",
                0),
      float_key("federated.dp_delta", "1e-5", "DP: the delta epsilon is reported at.", 1e-12, 0.5),
  };
}

// federated.*: the server process, its transport, and fl-sim's simulated faults.
std::vector<KeySpec> federated_server_keys() {
  return {
      float_key("federated.round_deadline_s", "60",
                "A client that has not answered this long after a round's request is left out "
                "of the round.",
                0.01),
      int_key("federated.eval_every", "1",
              "Evaluate the global model on the held-out split every N rounds (and after the "
              "last).",
              1),
      string_key("federated.address", "0.0.0.0:7070",
                 "`fl-server`: HOST:PORT to listen on (port 0 picks a free one; see "
                 "`--port-file`)."),
      path_key("federated.tls_cert", "",
               "`fl-server`: PEM certificate it presents (required: there is no plaintext "
               "mode)."),
      path_key("federated.tls_key", "", "`fl-server`: PEM private key of `federated.tls_cert`."),
      path_key("federated.tls_client_ca", "",
               "`fl-server`: PEM CA; when set, clients must present a certificate it signed "
               "(mutual TLS)."),
      path_key("federated.tokens", "",
               "`fl-server`: file of `NAME TOKEN [EXPIRES_UNIX]` lines; each client "
               "authenticates with its token."),
      float_key("federated.max_message_mb", "64",
                "Largest message either side accepts, in MiB; larger ones are refused.", 0.001),
      float_key("federated.wait_clients_s", "120",
                "`fl-server`: how long to wait for `federated.clients` clients before the first "
                "round (it starts with fewer if at least `federated.min_clients` came).",
                0),
      path_key("federated.eval_data", "",
               "`fl-server`: held-out data to evaluate on: a Fashion-MNIST directory (only the "
               "t10k files are read), or with `data.name: csv` a CSV file with the clients' "
               "columns (required: the model's shape is read from it); empty = none."),
      float_key("federated.sim_dropout", "0",
                "`fl-sim`: probability that a sampled client drops out of a round.", 0, 1),
      float_key("federated.sim_byzantine_fraction", "0",
                "`fl-sim`: fraction of clients that send sign-flipped, scaled updates.", 0, 1),
      float_key("federated.sim_attack_scale", "4",
                "`fl-sim`: byzantine clients send -scale x their true update.", 0),
  };
}

}  // namespace krab::core::key_specs
