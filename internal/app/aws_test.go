package app

import (
	"context"
	"testing"
)

// TestAWSCredentialsLoadedOnce: the AWS configuration is loaded at the
// first SASL handshake and its (SDK-cached) credentials reused by later
// ones, not loaded again for every connection.
func TestAWSCredentialsLoadedOnce(t *testing.T) {
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDFIRST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret1")
	a := &awsCredentials{region: "eu-west-1"}
	first, err := a.retrieve(context.Background())
	if err != nil || first.AccessKeyID != "AKIDFIRST" {
		t.Fatalf("first handshake: %v %v", first.AccessKeyID, err)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDSECOND") // a reload would see this
	again, err := a.retrieve(context.Background())
	if err != nil || again.AccessKeyID != "AKIDFIRST" {
		t.Fatalf("second handshake: %v %v (the configuration was loaded again)", again.AccessKeyID, err)
	}
}
