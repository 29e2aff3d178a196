"""Serving a registered model: a replica process that loads a saved model version and answers
predictions, batching requests across clients (:mod:`trainhouse.serving.replica`)."""
