"""The Python client of a Ragline server: HTTP calls with their retries (`http`) and the bulk
loader (`bulk`). The CLI, the bench and the demo use it; it talks to the services over HTTP only."""
