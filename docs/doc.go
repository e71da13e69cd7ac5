// Package docs holds the user manual; its test checks the links.
package docs
