"""Stored responses of the Responses API (`store`, `previous_response_id`)."""
