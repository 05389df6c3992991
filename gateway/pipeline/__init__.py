"""One request's way through the gateway: the endpoints' table and the stages."""
