package io.scd2sink.e2e.apicurio;

import java.util.Collections;

import javax.enterprise.inject.Produces;
import javax.inject.Singleton;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import io.quarkus.arc.Unremovable;

/**
 * Stands in for the bean that apicurio-common-app-components-config-index's
 * build step would generate (its -deployment jar is not on Maven Central): an
 * empty list of dynamic configuration properties.
 */
@Singleton
public class DynamicConfigPropertyListProducer {

    @Produces
    @Singleton
    @Unremovable
    DynamicConfigPropertyList dynamicConfigPropertyList() {
        return new DynamicConfigPropertyList(Collections.emptyList());
    }
}
