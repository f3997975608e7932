"""A client on `Dispatcher.connect` for the client scenarios of the official MCP conformance suite.

The suite (`@modelcontextprotocol/conformance`, npm; it needs Node 22 or newer, which the npm package
``node@22`` ships; `make conformance` installs both into .conformance/) starts a scripted server per
scenario and runs this with the server's URL last, the scenario's name in ``MCP_CONFORMANCE_SCENARIO``
and what it needs (client credentials) as JSON in ``MCP_CONFORMANCE_CONTEXT``::

    node .conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js client \\
        --command "python -m scripts.conformance_client" --scenario elicitation-sep1034-client-defaults

It connects, lists the tools, calls each with arguments made from its schema, and accepts every question
with an empty form, so that the form's defaults are what the server gets. An ``auth/`` scenario connects
through a client factory whose HTTP client carries the SDK's OAuth provider (`mcp.client.auth`): the
authorization-code flow by default (its redirect is followed here, as a browser would), client
credentials for the ``client-credentials`` scenarios, pre-registered credentials when the context gives
them, and for cross-app access the SDK's identity-assertion provider, given the ID-JAG that the
enterprise IdP exchanges for its ID token. .ci/conformance/expected.toml lists each scenario and its
result (why it fails, for those that do).
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

import anyio
import httpx2
from mcp import Client
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl

from dispatcher import Answer, Dispatcher, Question, ToolCall

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

_SAMPLE = {"number": 1, "integer": 1, "string": "x", "boolean": True}
_REDIRECT = "http://localhost:3000/callback"


def _arguments(schema: dict[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    return {name: _SAMPLE.get(spec.get("type"), "x") for name, spec in properties.items()}


async def _ask(question: Question) -> Answer:
    print(question.text(), flush=True)
    return Answer.accept({})


class _Memory(TokenStorage):
    """Tokens and client registration kept for the one run."""

    def __init__(self, client: OAuthClientInformationFull | None = None) -> None:
        self._tokens: OAuthToken | None = None
        self._client = client

    async def get_tokens(self) -> OAuthToken | None:
        return self._tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self._tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self._client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self._client = client_info


class _Browser:
    """The person's browser in the authorization-code flow: opens the URL and reads the code off the redirect."""

    def __init__(self) -> None:
        self._result: AuthorizationCodeResult | None = None

    async def open(self, url: str) -> None:
        async with httpx2.AsyncClient() as http:
            response = await http.get(url, follow_redirects=False)
        location = response.headers.get("location")
        if location is None:
            raise RuntimeError(f"the authorization server answered {response.status_code}, not a redirect")
        query = parse_qs(urlparse(location).query)
        if "code" not in query:
            raise RuntimeError(f"the redirect carries no code: {location}")
        state, issuer = query.get("state"), query.get("iss")
        self._result = AuthorizationCodeResult(
            code=query["code"][0], state=state[0] if state else None, iss=issuer[0] if issuer else None
        )

    async def callback(self) -> AuthorizationCodeResult:
        result, self._result = self._result, None
        if result is None:
            raise RuntimeError("no authorization code: the redirect was not followed")
        return result


async def _issuer(url: str) -> str:
    """The MCP server's authorization server, from its protected-resource metadata (RFC 9728)."""
    parsed = urlparse(url)
    origin = f"{parsed.scheme}://{parsed.netloc}"
    async with httpx2.AsyncClient() as http:
        for path in (f"/.well-known/oauth-protected-resource{parsed.path}", "/.well-known/oauth-protected-resource"):
            response = await http.get(origin + path)
            if response.status_code == 200:
                return str(response.json()["authorization_servers"][0])
    raise RuntimeError(f"no protected-resource metadata for {url}")


def _cross_app(url: str, issuer: str, context: dict[str, Any]) -> httpx2.Auth:
    """SEP-990: the enterprise IdP's ID token exchanged for an ID-JAG (RFC 8693), then a JWT bearer grant."""

    async def id_jag(audience: str, resource: str) -> str:
        async with httpx2.AsyncClient() as http:
            response = await http.post(
                context["idp_token_endpoint"],
                data={
                    "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
                    "requested_token_type": "urn:ietf:params:oauth:token-type:id-jag",
                    "subject_token": context["idp_id_token"],
                    "subject_token_type": "urn:ietf:params:oauth:token-type:id_token",
                    "audience": audience,
                    "resource": resource,
                    "client_id": context["idp_client_id"],
                },
            )
        response.raise_for_status()
        return str(response.json()["access_token"])

    return IdentityAssertionOAuthProvider(
        server_url=url,
        storage=_Memory(),
        client_id=context["client_id"],
        client_secret=context["client_secret"],
        issuer=issuer,
        assertion_provider=id_jag,
        token_endpoint_auth_method="client_secret_basic",  # OAuth's default for a confidential client
    )


def _provider(url: str, scenario: str, context: dict[str, Any]) -> OAuthClientProvider:
    """The SDK's OAuth provider a scenario needs."""
    if scenario == "auth/client-credentials-jwt":
        assertion = SignedJWTParameters(
            issuer=context["client_id"],
            subject=context["client_id"],
            signing_algorithm=context.get("signing_algorithm", "ES256"),
            signing_key=context["private_key_pem"],
        )
        return PrivateKeyJWTOAuthProvider(
            server_url=url,
            storage=_Memory(),
            client_id=context["client_id"],
            assertion_provider=assertion.create_assertion_provider(),
        )
    if scenario == "auth/client-credentials-basic":
        return ClientCredentialsOAuthProvider(
            server_url=url, storage=_Memory(), client_id=context["client_id"], client_secret=context["client_secret"]
        )
    registered = None
    if "client_id" in context and "client_secret" in context:  # pre-registered: no dynamic registration
        registered = OAuthClientInformationFull(
            client_id=context["client_id"],
            client_secret=context["client_secret"],
            redirect_uris=[AnyUrl(_REDIRECT)],
            token_endpoint_auth_method="client_secret_basic",
        )
    browser = _Browser()
    return OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="dispatcher-conformance",
            redirect_uris=[AnyUrl(_REDIRECT)],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
        ),
        storage=_Memory(registered),
        redirect_handler=browser.open,
        callback_handler=browser.callback,
        client_metadata_url="https://conformance-test.local/client-metadata.json",
    )


async def target(url: str, scenario: str, context: dict[str, Any]) -> str | Callable[[], Client]:
    """What `connect` gets: the URL, or for an ``auth/`` scenario a factory whose HTTP client runs OAuth."""
    if not scenario.startswith("auth/"):
        return url
    provider: httpx2.Auth
    if scenario == "auth/cross-app-access-complete-flow":
        provider = _cross_app(url, await _issuer(url), context)
    else:
        provider = _provider(url, scenario, context)

    @asynccontextmanager
    async def authorized() -> AsyncIterator[Any]:
        async with (
            httpx2.AsyncClient(auth=provider, timeout=20) as http,
            streamable_http_client(url, http_client=http) as streams,
        ):
            yield streams

    return lambda: Client(authorized())


async def main(url: str) -> None:
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    async with Dispatcher(ask_user=_ask, call_timeout=20) as dispatcher:
        server = await target(url, scenario, context)
        entries = await dispatcher.connect("conformance", server, trusted=True, connect_timeout=20)
        calls = [ToolCall(str(n), entry.name, _arguments(dict(entry.input_schema))) for n, entry in enumerate(entries)]
        for result in await dispatcher.dispatch(calls):
            print(result.call.name, result.status.value, result.error, flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[-1])
